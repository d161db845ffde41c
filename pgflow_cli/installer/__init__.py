"""The one installer: ordered, checksummed migrations recorded in ``pgflow.schema_migrations``.

``pgflow migrate``, ``pgflow sandbox`` and the test harness all install through
:func:`apply`; a fresh install is the same files from the start.

Rules:

* migrations are literal files ``sql/migrations/NNNN_name.sql``, applied in ``NNNN`` order, each
  in one transaction together with its ledger row (all or nothing), or phase by phase when it is
  large (``--@phase``);
* the ledger stores the SHA-256 of the migration's text; a recorded checksum that differs from
  the file means the files changed after they were applied, and nothing more is applied
  (:class:`~pgflow_cli.errors.StateConflict`). Released migrations never change; at most one
  unreleased migration exists (``scripts/regenerate_migration.py`` writes its function section);
* a ledger of an earlier build holding its migrations 0003-0016 is converted into
  ``0003_queue_stage`` in one transaction, after a catalog comparison (:mod:`~pgflow_cli.installer.old_levels`);
  a partial set of them is refused;
* a ledger row the tool does not know means the database is newer than the tool:
  nothing is applied (exit 6);
* a session advisory lock keeps two migrators from interleaving;
* each transaction sets a small ``lock_timeout`` and no ``statement_timeout``; a lock
  timeout or deadlock rolls that migration back and is retried a bounded number of times.

The package, one concern a module (callers use this facade: ``from pgflow_cli import installer``):

* :mod:`~pgflow_cli.installer.files`: migration files and their directives (phases, locks, sections);
* :mod:`~pgflow_cli.installer.catalog`: catalog facts of the schema and of the functions, compared;
* :mod:`~pgflow_cli.installer.old_levels`: frozen knowledge of an earlier build's migrations 0003-0016;
* :mod:`~pgflow_cli.installer.ledger`: the ledger, the database probe and the plan;
* :mod:`~pgflow_cli.installer.runner`: applying, converting, aborting, locks, retries, progress events;
* :mod:`~pgflow_cli.installer.pgmq_bootstrap`: the pinned PGMQ SQL for databases without PGMQ.
"""

from __future__ import annotations

from pgflow_cli.installer.files import (
    BASELINE_VERSION,
    MAX_BATCH_PAGES,
    QUERIES,
    RELEASED_CHECKSUMS,
    Migration,
    Phase,
    PhasedMigration,
    TableLock,
    available_migrations,
    parse_phases,
    versions,
)
from pgflow_cli.installer.ledger import (
    DatabaseState,
    LedgerRow,
    MigrationStatus,
    Plan,
    ledger,
    make_plan,
    read_state,
)
from pgflow_cli.installer.pgmq_bootstrap import PGMQ_SQL_SHA256, PGMQ_SQL_VERSION, bundled_pgmq_sql, ensure_pgmq
from pgflow_cli.installer.runner import (
    Applied,
    ProgressFn,
    abort,
    apply,
    check_writable,
    install,
    locked_transaction,
    migrator_lock,
    take_locks,
)

__all__ = [
    "BASELINE_VERSION", "MAX_BATCH_PAGES", "PGMQ_SQL_SHA256", "PGMQ_SQL_VERSION", "QUERIES", "RELEASED_CHECKSUMS",
    "Applied", "DatabaseState", "LedgerRow", "Migration", "MigrationStatus", "Phase",
    "PhasedMigration", "Plan", "ProgressFn", "TableLock", "abort", "apply", "available_migrations",
    "bundled_pgmq_sql", "check_writable", "ensure_pgmq", "install", "ledger", "locked_transaction",
    "make_plan", "migrator_lock", "parse_phases", "read_state", "take_locks",
    "versions",
]

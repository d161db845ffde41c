"""The one installer: ordered, checksummed migrations recorded in ``pgflow.schema_migrations``.

``pgflow migrate``, ``pgflow sandbox`` and the test harness all install through
:func:`apply`; a fresh install is the same files from the start.

Rules:

* migrations are ``sql/migrations/NNNN_name.sql``, applied in ``NNNN`` order, each in
  one transaction together with its ledger row (all or nothing);
* the ledger stores the SHA-256 of the migration's text (after ``--@include`` expansion;
  ``--@apply`` lines count by name and pinned checksum, see below); a recorded checksum
  that differs from the file means the files changed after they were applied, and nothing
  more is applied (:class:`~pgflow_cli.errors.StateConflict`);
* from 0004 on a migration holds only what runs once (tables, columns, constraints,
  backfills) plus ``--@apply functions/<area>/<name>.sql sha256=<hex>`` lines: the function
  files it (re)applies, in its transaction, at the line's place. The pin is the SHA-256 of
  the file's text when the migration was written; the newest migration applying a file pins
  its current text. In one run each file runs in full in the last pending migration that
  applies it; an earlier pending migration that applies it keeps only what the file creates
  (:func:`~pgflow_cli.installer.files.create_only`), so its own grants and triggers find the
  function. The ledger records the checksum of every file run in full
  (``pgflow.schema_migration_files``). A target below a later change of a file it would
  apply is refused: that level's text of the file is not shipped (docs/architecture.md);
* a ledger row the tool does not know means the database is newer than the tool:
  nothing is applied (exit 6);
* a session advisory lock keeps two migrators from interleaving;
* each transaction sets a small ``lock_timeout`` and no ``statement_timeout``; a lock
  timeout or deadlock rolls that migration back and is retried a bounded number of times.

The package, one concern a module (callers use this facade: ``from pgflow_cli import installer``):

* :mod:`~pgflow_cli.installer.files`: migration files and their directives (phases, ``--@apply``);
* :mod:`~pgflow_cli.installer.ledger`: the ledger, the database probe and the plan;
* :mod:`~pgflow_cli.installer.runner`: applying, aborting, locks, retries, progress events;
* :mod:`~pgflow_cli.installer.pgmq_bootstrap`: the pinned PGMQ SQL for databases without PGMQ.
"""

from __future__ import annotations

from pgflow_cli.installer.files import (
    BASELINE_VERSION,
    MAX_BATCH_PAGES,
    QUERIES,
    RELEASED_CHECKSUMS,
    FileApply,
    Migration,
    Phase,
    PhasedMigration,
    TableLock,
    available_migrations,
    parse_applies,
    parse_phases,
    versions,
)
from pgflow_cli.installer.ledger import (
    DatabaseState,
    FileStatus,
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
    file_runs,
    install,
    locked_transaction,
    migrator_lock,
    take_locks,
)

__all__ = [
    "BASELINE_VERSION", "MAX_BATCH_PAGES", "PGMQ_SQL_SHA256", "PGMQ_SQL_VERSION", "QUERIES", "RELEASED_CHECKSUMS",
    "Applied", "DatabaseState", "FileApply", "FileStatus", "LedgerRow", "Migration", "MigrationStatus", "Phase",
    "PhasedMigration", "Plan", "ProgressFn", "TableLock", "abort", "apply", "available_migrations",
    "bundled_pgmq_sql", "check_writable", "ensure_pgmq", "file_runs", "install", "ledger", "locked_transaction",
    "make_plan", "migrator_lock", "parse_applies", "parse_phases", "read_state", "take_locks",
    "versions",
]

"""The one installer: ordered, checksummed migrations recorded in ``pgflow.schema_migrations``.

``pgflow migrate``, ``pgflow sandbox`` and the test harness all install through
:func:`apply`; a fresh install is the same files from the start.

Rules:

* migrations are ``sql/migrations/NNNN_name.sql``, applied in ``NNNN`` order, each in
  one transaction together with its ledger row (all or nothing);
* the ledger stores the SHA-256 of the executed text (after ``--@include`` expansion);
  a recorded checksum that differs from the file means the files changed after they
  were applied, and nothing more is applied (:class:`~pgflow_cli.errors.StateConflict`);
* a ledger row the tool does not know means the database is newer than the tool:
  nothing is applied (exit 6);
* a session advisory lock keeps two migrators from interleaving;
* each transaction sets a small ``lock_timeout`` and no ``statement_timeout``; a lock
  timeout or deadlock rolls that migration back and is retried a bounded number of times.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import dict_row

from pgflow_cli import __version__, sqlfiles
from pgflow_cli.db import first_line, retry_on_lock, transaction
from pgflow_cli.errors import LockTimeout, SchemaMissing, StateConflict

_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")
QUERIES = "queries/installer.sql"

BASELINE_VERSION = 2
"""Last migration of the released baseline (schema + runtime): the state an upgrade starts from."""


@dataclass(frozen=True)
class Migration:
    """One migration file.

    Attributes:
        version: the 4-digit number, the apply order.
        name: the descriptive part of the file name.
        path: path below ``sql/``.
        sql: text as executed (includes expanded).
        checksum: SHA-256 hex of ``sql``.
    """

    version: int
    name: str
    path: str

    @property
    def sql(self) -> str:
        return sqlfiles.load(self.path)

    @property
    def checksum(self) -> str:
        return sqlfiles.checksum(self.sql)

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


@lru_cache(maxsize=1)
def available_migrations() -> tuple[Migration, ...]:
    """Every migration shipped with this tool, in apply order."""
    root = sqlfiles.sql_root() / "migrations"
    found = []
    for path in sorted(root.iterdir()):
        match = _FILE.match(path.name)
        if match:
            found.append(Migration(int(match["version"]), match["name"], f"migrations/{path.name}"))
    versions = [m.version for m in found]
    if len(versions) != len(set(versions)):
        raise RuntimeError(f"duplicate migration numbers in {root}")
    return tuple(found)


@dataclass(frozen=True)
class DatabaseState:
    """What a catalog probe found (no writes)."""

    has_pgflow_schema: bool
    has_ledger: bool
    has_flows_table: bool
    has_pgmq_schema: bool
    has_pgmq_meta: bool
    pgmq_extension_version: str | None
    pgmq_schema_comment: str | None
    server_version_num: int
    database_name: str

    @property
    def pgmq_version(self) -> str | None:
        """PGMQ version: the extension's, or the one pgflow-cli recorded for a SQL-only install."""
        if self.pgmq_extension_version:
            return self.pgmq_extension_version
        match = re.search(r"PGMQ (\S+)", self.pgmq_schema_comment or "")
        return match.group(1) if match else None

    @property
    def foreign_pgflow(self) -> bool:
        """A pgflow schema with tables that pgflow-cli did not install (no ledger)."""
        return self.has_flows_table and not self.has_ledger


def read_state(conn: psycopg.Connection) -> DatabaseState:
    """Probe the catalog for the pgflow schema, the ledger and PGMQ."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sqlfiles.statement(QUERIES, "database_state"))
        row = cur.fetchone()
    assert row is not None
    return DatabaseState(**row)


@dataclass(frozen=True)
class LedgerRow:
    version: int
    name: str
    checksum: str
    tool_version: str
    applied_by: str
    applied_at: Any
    duration_ms: int


@dataclass(frozen=True)
class MigrationStatus:
    """A migration's state in one database.

    ``state`` is one of ``applied``, ``pending``, ``changed`` (file differs from the
    recorded checksum) or ``unknown`` (recorded, but this tool has no such file).
    """

    version: int
    name: str
    state: str
    file_checksum: str | None
    recorded: LedgerRow | None = None


@dataclass
class Plan:
    """Comparison of shipped migrations with a database's ledger."""

    state: DatabaseState
    statuses: list[MigrationStatus] = field(default_factory=list)

    @property
    def pending(self) -> list[Migration]:
        by_version = {m.version: m for m in available_migrations()}
        return [by_version[s.version] for s in self.statuses if s.state == "pending"]

    @property
    def changed(self) -> list[MigrationStatus]:
        return [s for s in self.statuses if s.state == "changed"]

    @property
    def unknown(self) -> list[MigrationStatus]:
        return [s for s in self.statuses if s.state == "unknown"]

    def refuse_reasons(self) -> StateConflict | None:
        """The conflict that forbids applying anything, or ``None``."""
        if self.state.foreign_pgflow:
            return StateConflict(
                "this database has a pgflow schema that pgflow-cli did not install (no pgflow.schema_migrations ledger)",
                hint="run `pgflow audit` for the upgrade report; adopting an existing upstream installation "
                "is not supported by this version (docs/upgrade.md)",
            )
        if self.unknown:
            return StateConflict(
                "the database is newer than this tool: it records migrations this version does not ship",
                hint="upgrade pgflow-cli to the version that applied them",
                detail=[f"{s.version:04d}_{s.name} (applied by pgflow-cli {s.recorded.tool_version if s.recorded else '?'})" for s in self.unknown],
            )
        if self.changed:
            return StateConflict(
                "migration files differ from what was applied (checksum mismatch)",
                hint="reinstall the pgflow-cli version that applied them; never edit an applied migration",
                detail=[f"sql/migrations/{s.version:04d}_{s.name}.sql: recorded {s.recorded.checksum[:12] if s.recorded else '?'}…, file {(s.file_checksum or '')[:12]}…" for s in self.changed],
            )
        return None


def ledger(conn: psycopg.Connection) -> list[LedgerRow]:
    """Rows of ``pgflow.schema_migrations`` (empty when there is no ledger)."""
    if not read_state(conn).has_ledger:
        return []
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sqlfiles.statement(QUERIES, "ledger_rows"))
        return [LedgerRow(**row) for row in cur.fetchall()]


def make_plan(conn: psycopg.Connection) -> Plan:
    """Compare the shipped migrations with the database's ledger (read-only)."""
    state = read_state(conn)
    recorded = {row.version: row for row in (ledger(conn) if state.has_ledger else [])}
    plan = Plan(state)
    for migration in available_migrations():
        row = recorded.pop(migration.version, None)
        if row is None:
            plan.statuses.append(MigrationStatus(migration.version, migration.name, "pending", migration.checksum))
        elif row.checksum != migration.checksum:
            plan.statuses.append(MigrationStatus(migration.version, migration.name, "changed", migration.checksum, row))
        else:
            plan.statuses.append(MigrationStatus(migration.version, migration.name, "applied", migration.checksum, row))
    for row in recorded.values():
        plan.statuses.append(MigrationStatus(row.version, row.name, "unknown", None, row))
    plan.statuses.sort(key=lambda s: s.version)
    return plan


def bundled_pgmq_sql() -> tuple[str, str]:
    """The PGMQ install script bundled in the ``pgmq`` PyPI package, and its version.

    Returns:
        ``(version, sql_text)``.
    """
    from importlib import resources

    base = resources.files("pgmq").joinpath("sql")
    version = base.joinpath("VERSION").read_text(encoding="utf-8").strip().splitlines()[0].strip()
    return version, base.joinpath("pgmq.sql").read_text(encoding="utf-8")


def ensure_pgmq(conn: psycopg.Connection) -> str | None:
    """Install PGMQ from the bundled SQL when the database has none.

    Runs in one transaction. Does nothing when a ``pgmq`` schema with its ``meta`` table
    exists (extension or SQL install).

    Returns:
        The version installed, or ``None`` when PGMQ was already there.
    """
    state = read_state(conn)
    if state.has_pgmq_meta:
        return None
    version, script = bundled_pgmq_sql()
    with transaction(conn, lock_timeout=30, statement_timeout=None):
        conn.execute(script)  # type: ignore[arg-type]  # trusted, shipped SQL
        conn.execute(
            pgsql.SQL("COMMENT ON SCHEMA pgmq IS {}").format(
                pgsql.Literal(f"PGMQ {version} (SQL install by pgflow-cli {__version__})")
            )
        )
    return version


ProgressFn = Callable[[str, dict[str, Any]], None]


@dataclass
class Applied:
    """Result of applying one migration."""

    migration: Migration
    duration_ms: int
    attempts: int
    notices: list[str] = field(default_factory=list)


def apply(
    conn: psycopg.Connection,
    *,
    target: int | None = None,
    lock_timeout: float = 5.0,
    attempts: int = 5,
    progress: ProgressFn | None = None,
    lock_wait: float = 30.0,
    before_commit: Callable[[psycopg.Connection, Migration], None] | None = None,
    dry_run: bool = False,
) -> list[Applied]:
    """Apply pending migrations in order, each atomically with its ledger row.

    Args:
        conn: an autocommit connection (its session takes the migrator lock).
        target: apply up to and including this version (default: all).
        lock_timeout: seconds each statement may wait for a lock before the migration
            is rolled back and retried.
        attempts: tries per migration on lock timeouts and deadlocks.
        progress: ``progress(event, data)`` callback for stderr reporting
            (events: ``lock_wait``, ``start``, ``retry``, ``done``).
        lock_wait: seconds to wait for another migrator's session lock.
        before_commit: hook run inside each migration's transaction just before it
            commits (used by ``--dry-run`` reporting and tests).
        dry_run: run every pending migration and roll each back (nothing is kept; later
            migrations then run on a database without the earlier ones, so only the
            first pending migration is tried).

    Returns:
        One :class:`Applied` per migration applied (or tried, in a dry run).

    Raises:
        StateConflict: ledger mismatch, unknown migrations, foreign pgflow schema (exit 6).
        SchemaMissing: PGMQ is not installed (exit 3).
        LockTimeout: a lock could not be taken within the retries (exit 4).
    """
    emit = progress or (lambda event, data: None)
    _take_migrator_lock(conn, lock_wait, emit)
    try:
        plan = make_plan(conn)
        conflict = plan.refuse_reasons()
        if conflict:
            raise conflict
        if not plan.state.has_pgmq_meta:
            raise SchemaMissing(
                "PGMQ is not installed in this database",
                hint="install the pgmq extension (CREATE EXTENSION pgmq) or rerun with --install-pgmq "
                "to install the PGMQ SQL bundled with pgflow-cli",
            )
        todo = [m for m in plan.pending if target is None or m.version <= target]
        if dry_run:
            todo = todo[:1]
        results = []
        for migration in todo:
            results.append(_apply_one(conn, migration, lock_timeout, attempts, emit, before_commit, dry_run))
        return results
    finally:
        if not conn.closed:
            conn.execute(sqlfiles.statement(QUERIES, "migrator_unlock"))


class _DryRunRollback(Exception):
    pass


def _apply_one(
    conn: psycopg.Connection,
    migration: Migration,
    lock_timeout: float,
    attempts: int,
    emit: ProgressFn,
    before_commit: Callable[[psycopg.Connection, Migration], None] | None,
    dry_run: bool,
) -> Applied:
    tries = 0
    notices: list[str] = []

    def collect(diag: psycopg.errors.Diagnostic) -> None:
        if diag.message_primary:
            notices.append(diag.message_primary)

    def attempt() -> int:
        nonlocal tries
        tries += 1
        notices.clear()
        emit("start", {"migration": migration.label, "attempt": tries})
        started = time.monotonic()
        try:
            with transaction(conn, lock_timeout=lock_timeout, statement_timeout=None):
                conn.execute(sqlfiles.statement(QUERIES, "ledger_bootstrap"))
                conn.execute(migration.sql)  # type: ignore[arg-type]  # trusted, shipped SQL
                duration_ms = int((time.monotonic() - started) * 1000)
                conn.execute(
                    sqlfiles.statement(QUERIES, "ledger_insert"),
                    {
                        "version": migration.version,
                        "name": migration.name,
                        "checksum": migration.checksum,
                        "tool_version": __version__,
                        "duration_ms": duration_ms,
                    },
                )
                if before_commit:
                    before_commit(conn, migration)
                if dry_run:
                    raise _DryRunRollback()
        except _DryRunRollback:
            pass
        return int((time.monotonic() - started) * 1000)

    def on_retry(number: int, exc: BaseException, delay: float) -> None:
        emit("retry", {"migration": migration.label, "attempt": number, "error": first_line(exc), "sleep": round(delay, 2)})

    conn.add_notice_handler(collect)
    try:
        duration = retry_on_lock(attempt, attempts=attempts, on_retry=on_retry)
    finally:
        conn.remove_notice_handler(collect)
    emit("done", {"migration": migration.label, "duration_ms": duration, "attempts": tries, "dry_run": dry_run})
    return Applied(migration, duration, tries, list(notices))


def _take_migrator_lock(conn: psycopg.Connection, wait: float, emit: ProgressFn) -> None:
    deadline = time.monotonic() + wait
    announced = False
    while True:
        row = conn.execute(sqlfiles.statement(QUERIES, "migrator_try_lock")).fetchone()
        if row and row[0]:
            return
        with conn.cursor(row_factory=dict_row) as cur:
            holders = cur.execute(sqlfiles.statement(QUERIES, "migrator_lock_holder")).fetchall()
        if not announced:
            emit("lock_wait", {"holders": holders})
            announced = True
        if time.monotonic() >= deadline:
            raise LockTimeout(
                "another migrator holds the pgflow migration lock",
                hint="wait for it to finish; the holder is listed below",
                detail=[f"pid {h['pid']} ({h['application_name'] or 'no application name'}), {h['state']}, connected {h['connected_seconds']}s" for h in holders],
            )
        time.sleep(0.5)


def install(conn: psycopg.Connection, *, target: int | None = None, with_pgmq: bool = True,
            progress: ProgressFn | None = None) -> list[Applied]:
    """Install PGMQ (if asked and missing) and apply pending migrations: the sandbox/test entry point."""
    if with_pgmq:
        ensure_pgmq(conn)
    return apply(conn, target=target, progress=progress)


def versions(migrations: Sequence[Migration]) -> list[int]:
    """Version numbers of ``migrations`` (helper for messages and tests)."""
    return [m.version for m in migrations]

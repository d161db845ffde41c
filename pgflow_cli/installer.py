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
  its current text. In one run each file runs once, in the last pending migration that
  applies it, and the ledger records the checksum of every file run
  (``pgflow.schema_migration_files``). A target below a later change of a file it would
  apply is refused: that level's text of the file is not shipped (docs/architecture.md);
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


_PHASE = re.compile(r"^--@phase[ \t]+(?P<name>[a-z_]+)(?:[ \t]+(?P<mode>tx|batch|notx))?[ \t]*$", re.MULTILINE)
MAX_BATCH_PAGES = 16384
"""Upper bound of one backfill range, heap pages (128 MiB)."""

_APPLY = re.compile(r"^--@apply\b(?P<rest>.*)$", re.MULTILINE)
_APPLY_LINE = re.compile(r"^[ \t]+(?P<path>functions/[a-z0-9_/]+\.sql)[ \t]+sha256=(?P<sha>[0-9a-f]{64})[ \t]*$")
_WORKER_PROTOCOL = re.compile(r"^--@worker-protocol[ \t]+(\d+)[ \t]*$", re.MULTILINE)
_PREFLIGHT = re.compile(r"^--@preflight[ \t]+audit[ \t]*$", re.MULTILINE)
_THRESHOLD = re.compile(r"^--@online-threshold[ \t]+(?P<table>[a-z_.]+)[ \t]+(?P<rows>\d+)[ \t]*$", re.MULTILINE)


@dataclass(frozen=True)
class Phase:
    """One phase of a phased migration.

    Attributes:
        name: ``prepare``, ``backfill``, ``index``, ``main``, ``abort``...
        mode: ``tx`` (one transaction), ``batch`` (one statement taking ``%(first_page)s`` and
            ``%(pages)s`` and returning ``(rows_updated, relation_pages)``, run over the table's
            heap in page ranges, each range its own transaction) or ``notx`` (one statement
            outside any transaction, e.g. ``CREATE INDEX CONCURRENTLY``; an optimisation only:
            the final phase must reach the same state on its own).
        sql: the phase's text.
    """

    name: str
    mode: str
    sql: str


@dataclass(frozen=True)
class PhasedMigration:
    """A migration split by ``--@phase`` markers.

    On small databases every phase runs in one transaction (``notx`` phases skipped), so
    the migration is all or nothing. When the ``--@online-threshold TABLE ROWS`` table is
    larger, phases commit one by one: short locks, a batched backfill, a concurrent index
    build, and a final transaction that records the ledger row. Until that final commit
    the database keeps its old behaviour; a rerun resumes; ``pgflow migrate abort`` runs
    the ``abort`` phase to undo the preparation.
    """

    phases: tuple[Phase, ...]
    threshold_table: str | None
    threshold_rows: int

    @property
    def apply_phases(self) -> tuple[Phase, ...]:
        return tuple(p for p in self.phases if p.name != "abort")

    @property
    def abort(self) -> Phase | None:
        return next((p for p in self.phases if p.name == "abort"), None)

    @property
    def has_online_phases(self) -> bool:
        return any(p.mode in ("batch", "notx") for p in self.apply_phases)

    def estimated_rows(self, conn: psycopg.Connection) -> int | None:
        """Planner estimate of the threshold table's rows (``None``: no threshold table or never analysed)."""
        if not self.threshold_table:
            return None
        row = conn.execute(sqlfiles.statement(QUERIES, "estimated_rows"), {"table": self.threshold_table}).fetchone()
        return None if row is None or row[0] is None or int(row[0]) < 0 else int(row[0])

    def large(self, conn: psycopg.Connection) -> bool:
        """True when the threshold table's row estimate exceeds the threshold."""
        estimate = self.estimated_rows(conn)
        return estimate is not None and estimate > self.threshold_rows

    def path(self, conn: psycopg.Connection, online: str = "auto") -> str:
        """Which path ``apply`` takes on this database, in words (for ``migrate plan``)."""
        if not self.has_online_phases or online == "never":
            return "one transaction"
        if online == "always":
            return "phased (forced)"
        estimate = self.estimated_rows(conn)
        size = "size unknown (never analysed)" if estimate is None else f"~{estimate:,} rows"
        kind = "phased" if self.large(conn) else "one transaction"
        return f"{kind} ({self.threshold_table} {size}; phased above {self.threshold_rows:,})"


def parse_phases(text: str) -> PhasedMigration | None:
    """Split migration text at ``--@phase`` markers; ``None`` when it has none."""
    markers = list(_PHASE.finditer(text))
    if not markers:
        return None
    phases = []
    for index, marker in enumerate(markers):
        end = markers[index + 1].start() if index + 1 < len(markers) else len(text)
        phases.append(Phase(marker["name"], marker["mode"] or "tx", text[marker.end():end].strip()))
    names = [p.name for p in phases]
    if len(names) != len(set(names)):
        raise ValueError(f"duplicate phase names: {names}")
    if phases[-1].name == "abort":
        apply_phases = phases[:-1]
    else:
        apply_phases = phases
    if not apply_phases or apply_phases[-1].mode != "tx":
        raise ValueError("the last phase to apply must be a transaction (mode tx)")
    threshold = _THRESHOLD.search(text)
    return PhasedMigration(
        tuple(phases),
        threshold["table"] if threshold else None,
        int(threshold["rows"]) if threshold else 0,
    )


@dataclass(frozen=True)
class Migration:
    """One migration file.

    Attributes:
        version: the 4-digit number, the apply order.
        name: the descriptive part of the file name.
        path: path below ``sql/``.
        sql: text as executed (includes expanded).
        checksum: SHA-256 hex of ``sql``.
        phased: its phases, or ``None`` for a plain one-transaction migration.
    """

    version: int
    name: str
    path: str

    @property
    def text(self) -> str:
        """The migration's own text: includes expanded, ``--@apply`` lines as written (by name)."""
        return sqlfiles.load(self.path)

    @property
    def checksum(self) -> str:
        """SHA-256 of :attr:`text`: what the ledger records for this migration."""
        return sqlfiles.checksum(self.text)

    @property
    def applies(self) -> tuple[FileApply, ...]:
        """The function files this migration (re)applies, in order (``--@apply`` lines)."""
        return parse_applies(self.text, self.label)

    @property
    def sql(self) -> str:
        """The text as executed when this migration runs on its own (every ``--@apply`` expanded)."""
        return self.executed()

    def executed(self, skip: frozenset[str] = frozenset()) -> str:
        """The text to execute: each ``--@apply`` line replaced by its file, except the files in
        ``skip`` (a later migration of the same run applies them; the line stays, a comment)."""
        if not self.applies:
            return self.text

        def expand(match: re.Match[str]) -> str:
            path = _APPLY_LINE.match(match.group("rest"))
            assert path is not None  # parse_applies checked every line
            if path["path"] in skip:
                return f"{match.group(0)} -- runs in a later migration of this run"
            return sqlfiles.load(path["path"]).rstrip("\n")

        return _APPLY.sub(expand, self.text)

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"

    @property
    def phased(self) -> PhasedMigration | None:
        return parse_phases(self.sql)

    @property
    def worker_protocol(self) -> int | None:
        """The worker protocol this migration switches the database to (``--@worker-protocol N``)."""
        match = _WORKER_PROTOCOL.search(self.sql)
        return int(match.group(1)) if match else None

    @property
    def preflight_audit(self) -> bool:
        """True when the file asks for ``pgflow audit``'s blocking rules to pass before any lock
        (``--@preflight audit``); the migration rechecks them itself under its locks."""
        return bool(_PREFLIGHT.search(self.sql))

    def phases_for_single_transaction(self, skip: frozenset[str] = frozenset()) -> list[Phase]:
        """What runs when the whole migration is one transaction (``notx`` phases skipped)."""
        text = self.executed(skip)
        phased = parse_phases(text)
        if phased is None:
            return [Phase("main", "tx", text)]
        return [p for p in phased.apply_phases if p.mode != "notx"]


@dataclass(frozen=True)
class FileApply:
    """One ``--@apply`` line of a migration.

    Attributes:
        path: the function file below ``sql/`` (``functions/<area>/<name>.sql``).
        pinned: SHA-256 hex of the file's text when the migration was written.
    """

    path: str
    pinned: str

    @property
    def checksum(self) -> str:
        """SHA-256 hex of the file's text now (includes expanded)."""
        return sqlfiles.checksum(sqlfiles.load(self.path))


def parse_applies(text: str, label: str) -> tuple[FileApply, ...]:
    """The ``--@apply`` lines of a migration's text.

    Raises:
        RuntimeError: a malformed line or a missing file (a packaging error: the message
            gives the line to write).
    """
    found = []
    for match in _APPLY.finditer(text):
        line = _APPLY_LINE.match(match.group("rest"))
        if line is None:
            raise RuntimeError(f"{label}: malformed line {match.group(0)!r}: write "
                               "'--@apply functions/<area>/<name>.sql sha256=<SHA-256 of the file>'")
        if not (sqlfiles.sql_root() / line["path"]).is_file():
            raise RuntimeError(f"{label}: --@apply names a missing file sql/{line['path']}")
        found.append(FileApply(line["path"], line["sha"]))
    paths = [f.path for f in found]
    if len(paths) != len(set(paths)):
        raise RuntimeError(f"{label}: a function file is applied twice")
    return tuple(found)


def file_runs(migrations: Sequence[Migration], todo: Sequence[Migration]) -> dict[int, frozenset[str]]:
    """Which ``--@apply`` files each migration of ``todo`` skips: each file runs once, in the last
    migration of ``todo`` that applies it.

    Args:
        migrations: every shipped migration (to tell whether a later one changes a file again).
        todo: the migrations this run applies, in order.

    Returns:
        version -> paths that migration leaves to a later migration of the run.

    Raises:
        StateConflict: the run stops below a later change of a file it applies, so the file's
            text for that level is not shipped (exit 6); or a file differs from the text its
            newest migration pins (a packaging error).
    """
    last: dict[str, Migration] = {}
    for migration in todo:
        for applied in migration.applies:
            last[applied.path] = migration
    newest: dict[str, Migration] = {}
    for migration in migrations:
        for applied in migration.applies:
            newest[applied.path] = migration
    for path, migration in last.items():
        pinned = next(a.pinned for a in migration.applies if a.path == path)
        current = sqlfiles.checksum(sqlfiles.load(path))
        if pinned == current:
            continue
        if newest[path].version == migration.version:
            raise StateConflict(
                f"sql/{path} differs from the text migration {migration.label} pins",
                hint="this pgflow-cli build is inconsistent; reinstall it (developers: add the file to a new "
                "migration, docs/architecture.md \"How to change a function\")",
            )
        raise StateConflict(
            f"cannot stop at migration {todo[-1].label}: sql/{path} was changed again by "
            f"{newest[path].label}, and this tool ships only its newest text",
            hint=f"apply up to {newest[path].label} or later, or use the pgflow-cli release that shipped "
            f"{todo[-1].label} as its newest migration",
        )
    return {m.version: frozenset(a.path for a in m.applies if last[a.path].version != m.version) for m in todo}


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
    has_file_ledger: bool
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
    state: str = "applied"
    phases_done: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class MigrationStatus:
    """A migration's state in one database.

    ``state`` is one of ``applied``, ``pending``, ``in_progress`` (a phased migration that
    committed some phases; applying resumes it), ``changed`` (file differs from the recorded
    checksum) or ``unknown`` (recorded, but this tool has no such file).
    """

    version: int
    name: str
    state: str
    file_checksum: str | None
    recorded: LedgerRow | None = None


@dataclass(frozen=True)
class FileStatus:
    """A function file that migrations apply (``--@apply``), compared with what the database ran.

    ``state``: ``current`` (the database ran this text), ``pending`` (a pending migration
    applies it), ``differs`` (the database ran another text and no pending migration applies
    this one: installed functions differ from the files) or ``missing`` (never run here and no
    pending migration applies it).
    """

    path: str
    state: str
    file_checksum: str
    recorded_checksum: str | None
    recorded_version: int | None


@dataclass
class Plan:
    """Comparison of shipped migrations with a database's ledger."""

    state: DatabaseState
    statuses: list[MigrationStatus] = field(default_factory=list)
    files: list[FileStatus] = field(default_factory=list)

    @property
    def file_drift(self) -> list[FileStatus]:
        """Applied function files whose installed text differs from the file, with no migration pending to fix it."""
        return [f for f in self.files if f.state in ("differs", "missing")]

    @property
    def pending(self) -> list[Migration]:
        by_version = {m.version: m for m in available_migrations()}
        return [by_version[s.version] for s in self.statuses if s.state in ("pending", "in_progress")]

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
        elif row.state == "in_progress":
            plan.statuses.append(MigrationStatus(migration.version, migration.name, "in_progress", migration.checksum, row))
        else:
            plan.statuses.append(MigrationStatus(migration.version, migration.name, "applied", migration.checksum, row))
    for row in recorded.values():
        plan.statuses.append(MigrationStatus(row.version, row.name, "unknown", None, row))
    plan.statuses.sort(key=lambda s: s.version)
    plan.files = _file_statuses(conn, state, plan)
    return plan


def _file_statuses(conn: psycopg.Connection, state: DatabaseState, plan: Plan) -> list[FileStatus]:
    """Compare every ``--@apply`` file with the newest text the database recorded for it."""
    applied_anywhere = {a.path for m in available_migrations() for a in m.applies}
    if not applied_anywhere or not state.has_ledger:
        return []
    ran: dict[str, tuple[int, str]] = {}
    if state.has_file_ledger:
        with conn.cursor(row_factory=dict_row) as cur:
            for row in cur.execute(sqlfiles.statement(QUERIES, "ledger_files")).fetchall():
                ran[row["path"]] = (row["version"], row["checksum"])
    pending = {a.path for m in plan.pending for a in m.applies}
    applied_versions = {s.version for s in plan.statuses if s.state == "applied"}
    files = []
    for path in sorted(applied_anywhere):
        current = sqlfiles.checksum(sqlfiles.load(path))
        version, recorded = ran.get(path, (None, None))
        if path in pending:
            status = "pending"
        elif recorded == current:
            status = "current"
        elif recorded is None:
            # released 0001-0003 install the file's text without a per-file record
            appliers = [m.version for m in available_migrations() if any(a.path == path for a in m.applies)]
            status = "missing" if any(v in applied_versions for v in appliers) else "current"
        else:
            status = "differs"
        files.append(FileStatus(path, status, current, recorded, version))
    return files


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
    """Result of applying one migration.

    Attributes:
        migration: the migration.
        duration_ms: wall time of this call, milliseconds.
        attempts: transaction attempts used (lock-timeout retries included).
        online: whether the phased (online) path ran.
        notices: server notices raised while applying.
    """

    migration: Migration
    duration_ms: int
    attempts: int
    online: bool = False
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
    online: str = "auto",
    batch_pages: int = 64,
    batch_seconds: float = 0.2,
) -> list[Applied]:
    """Apply pending migrations in order, each atomically with its ledger row.

    Args:
        conn: an autocommit connection (its session takes the migrator lock).
        target: apply up to and including this version (default: all).
        lock_timeout: seconds each statement may wait for a lock before the transaction
            is rolled back and retried.
        attempts: tries per transaction on lock timeouts and deadlocks.
        progress: ``progress(event, data)`` callback for stderr reporting (events:
            ``lock_wait``, ``start``, ``retry``, ``phase``, ``batch``, ``done``).
        lock_wait: seconds to wait for another migrator's session lock.
        before_commit: hook run inside a migration's (final) transaction just before it
            commits (used by ``--dry-run`` reporting).
        dry_run: run the next pending migration in one transaction and roll it back.
        online: ``auto`` (phased when a migration's threshold table is large), ``always``
            or ``never`` (see :class:`PhasedMigration`).
        batch_pages: heap pages of the first backfill batch (later ones adapt).
        batch_seconds: time each backfill batch aims at, seconds: how long its rows stay locked.

    Returns:
        One :class:`Applied` per migration applied (or tried, in a dry run).

    Raises:
        StateConflict: ledger mismatch, unknown migrations, foreign pgflow schema (exit 6).
        SchemaMissing: PGMQ is not installed (exit 3).
        LockTimeout: a lock could not be taken within the retries (exit 4).
    """
    if online not in ("auto", "always", "never"):
        raise ValueError(f"online must be auto, always or never, not {online!r}")
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
        in_progress = {s.version: s.recorded for s in plan.statuses if s.state == "in_progress"}
        todo = [m for m in plan.pending if target is None or m.version <= target]
        skips = file_runs(available_migrations(), todo)
        if dry_run:
            todo = todo[:1]
        results = []
        for migration in todo:
            runner = _Runner(conn, migration, lock_timeout, attempts, emit, before_commit, batch_pages, batch_seconds,
                             skips[migration.version])
            phased = parse_phases(migration.executed(skips[migration.version]))
            resume = in_progress.get(migration.version)
            use_online = bool(phased and phased.has_online_phases and not dry_run and (
                resume is not None or online == "always" or (online == "auto" and phased.large(conn))))
            results.append(runner.run_online(resume) if use_online else runner.run_single(dry_run))
        return results
    finally:
        if not conn.closed:
            conn.execute(sqlfiles.statement(QUERIES, "migrator_unlock"))


class _DryRunRollback(Exception):
    pass


class _Runner:
    """Applies one migration: in one transaction, or phase by phase (online)."""

    def __init__(self, conn: psycopg.Connection, migration: Migration, lock_timeout: float, attempts: int,
                 emit: ProgressFn, before_commit: Callable[[psycopg.Connection, Migration], None] | None,
                 batch_pages: int, batch_seconds: float, skip: frozenset[str] = frozenset()) -> None:
        self.conn = conn
        self.migration = migration
        self.skip = skip
        self.lock_timeout = lock_timeout
        self.attempts = attempts
        self.emit = emit
        self.before_commit = before_commit
        self.batch_pages = max(1, batch_pages)
        self.batch_seconds = batch_seconds if batch_seconds > 0 else 0.2
        self.tries = 0
        self.notices: list[str] = []

    # shared -------------------------------------------------------------------------
    def _retrying(self, action: Callable[[], Any]) -> Any:
        def on_retry(number: int, exc: BaseException, delay: float) -> None:
            self.emit("retry", {"migration": self.migration.label, "attempt": number, "error": first_line(exc),
                                "sleep": round(delay, 2)})

        def counted() -> Any:
            self.tries += 1
            return action()

        def collect(diag: psycopg.errors.Diagnostic) -> None:
            if diag.message_primary:
                self.notices.append(diag.message_primary)

        self.conn.add_notice_handler(collect)
        try:
            return retry_on_lock(counted, attempts=self.attempts, on_retry=on_retry)
        finally:
            self.conn.remove_notice_handler(collect)

    def _record(self, *, state: str, phases_done: list[str], duration_ms: int) -> None:
        """Create the ledger if needed and record this migration's state (inside the caller's transaction)."""
        self.conn.execute(sqlfiles.statement(QUERIES, "ledger_bootstrap"))
        self.conn.execute(sqlfiles.statement(QUERIES, "ledger_record"), {
            "version": self.migration.version,
            "name": self.migration.name,
            "checksum": self.migration.checksum,
            "tool_version": __version__,
            "duration_ms": duration_ms,
            "state": state,
            "phases_done": phases_done,
        })
        ran = [a for a in self.migration.applies if a.path not in self.skip] if state == "applied" else []
        if ran:
            self.conn.execute(sqlfiles.statement(QUERIES, "ledger_files_bootstrap"))
            for applied in ran:
                self.conn.execute(sqlfiles.statement(QUERIES, "ledger_file_record"), {
                    "version": self.migration.version, "path": applied.path, "checksum": applied.checksum})

    def _backfill(self, phase: "Phase", *, own_transactions: bool) -> None:
        """Run a ``batch`` phase over the whole heap, one range of pages per statement.

        Each range is sized so that its statement takes about ``batch_seconds`` (the rows it
        updates stay locked that long): the next range's page count is the last one's scaled by
        budget / elapsed, at most doubled or quartered per step, between 1 and 16,384 pages.
        On the phased path every range is its own transaction (retried on lock timeouts).
        """
        label = self.migration.label
        first_page, pages = 0, self.batch_pages
        while True:
            def one(first_page: int = first_page, pages: int = pages) -> tuple[int, int]:
                params = {"first_page": first_page, "pages": pages}
                if own_transactions:
                    with transaction(self.conn, lock_timeout=self.lock_timeout, statement_timeout=None):
                        row = self.conn.execute(phase.sql, params).fetchone()  # type: ignore[arg-type]
                else:
                    row = self.conn.execute(phase.sql, params).fetchone()  # type: ignore[arg-type]
                return (int(row[0]), int(row[1])) if row else (0, 0)

            started = time.monotonic()
            updated, relation_pages = self._retrying(one) if own_transactions else one()
            elapsed = time.monotonic() - started
            self.emit("batch", {"migration": label, "phase": phase.name, "first_page": first_page, "pages": pages,
                                "relation_pages": relation_pages, "rows": updated, "ms": int(elapsed * 1000)})
            first_page += pages
            if first_page >= relation_pages:
                return
            wanted = pages * self.batch_seconds / elapsed if elapsed > 0 else pages * 2
            pages = int(max(pages / 4, min(pages * 2, wanted)))
            pages = max(1, min(MAX_BATCH_PAGES, pages))

    # one transaction ------------------------------------------------------------------
    def run_single(self, dry_run: bool) -> Applied:
        """Every phase in one transaction with the ledger row: all or nothing."""
        label = self.migration.label
        started = time.monotonic()

        def attempt() -> None:
            self.notices.clear()
            self.emit("start", {"migration": label, "attempt": self.tries, "online": False})
            t0 = time.monotonic()
            try:
                with transaction(self.conn, lock_timeout=self.lock_timeout, statement_timeout=None):
                    for phase in self.migration.phases_for_single_transaction(self.skip):
                        if phase.mode == "batch":
                            self._backfill(phase, own_transactions=False)
                        else:
                            self.conn.execute(phase.sql)  # type: ignore[arg-type]  # trusted, shipped SQL
                    self._record(state="applied", phases_done=[], duration_ms=int((time.monotonic() - t0) * 1000))
                    if self.before_commit:
                        self.before_commit(self.conn, self.migration)
                    if dry_run:
                        raise _DryRunRollback()
            except _DryRunRollback:
                pass

        self._retrying(attempt)
        duration = int((time.monotonic() - started) * 1000)
        self.emit("done", {"migration": label, "duration_ms": duration, "attempts": self.tries, "dry_run": dry_run,
                           "online": False})
        return Applied(self.migration, duration, self.tries, False, list(self.notices))

    # phase by phase ---------------------------------------------------------------------
    def run_online(self, resume: "LedgerRow | None") -> Applied:
        """Each phase in its own transaction(s); the ledger tracks progress so a rerun resumes."""
        label = self.migration.label
        phased = parse_phases(self.migration.executed(self.skip))
        assert phased is not None
        done = list(resume.phases_done) if resume else []
        started = time.monotonic()
        self.emit("start", {"migration": label, "attempt": 1, "online": True, "resumed_after": done})
        for phase in phased.apply_phases:
            if phase.name in done:
                continue
            self.emit("phase", {"migration": label, "phase": phase.name, "mode": phase.mode})
            t0 = time.monotonic()
            final = phase is phased.apply_phases[-1]
            if phase.mode == "notx":
                self._retrying(lambda: self._notx(phase))
                with transaction(self.conn, lock_timeout=self.lock_timeout, statement_timeout=None):
                    self._record(state="in_progress", phases_done=done + [phase.name],
                                 duration_ms=int((time.monotonic() - t0) * 1000))
            elif phase.mode == "batch":
                self._backfill(phase, own_transactions=True)
                with transaction(self.conn, lock_timeout=self.lock_timeout, statement_timeout=None):
                    self._record(state="in_progress", phases_done=done + [phase.name],
                                 duration_ms=int((time.monotonic() - t0) * 1000))
            else:
                def run_tx(phase: Phase = phase, final: bool = final) -> None:
                    with transaction(self.conn, lock_timeout=self.lock_timeout, statement_timeout=None):
                        self.conn.execute(phase.sql)  # type: ignore[arg-type]  # trusted, shipped SQL
                        self._record(state="applied" if final else "in_progress",
                                     phases_done=[] if final else done + [phase.name],
                                     duration_ms=int((time.monotonic() - t0) * 1000))
                        if final and self.before_commit:
                            self.before_commit(self.conn, self.migration)

                self._retrying(run_tx)
            done.append(phase.name)
            self.emit("phase_done", {"migration": label, "phase": phase.name,
                                     "duration_ms": int((time.monotonic() - t0) * 1000)})
        duration = int((time.monotonic() - started) * 1000)
        self.emit("done", {"migration": label, "duration_ms": duration, "attempts": self.tries, "dry_run": False,
                           "online": True})
        return Applied(self.migration, duration, self.tries, True, list(self.notices))

    def _notx(self, phase: "Phase") -> None:
        # Outside a transaction (CREATE INDEX CONCURRENTLY); a session lock_timeout still applies.
        timeout = sqlfiles.statement(QUERIES, "session_lock_timeout")
        self.conn.execute(timeout, {"value": f"{int(self.lock_timeout * 1000)}ms"})
        try:
            self.conn.execute(phase.sql)  # type: ignore[arg-type]  # trusted, shipped SQL
        finally:
            self.conn.execute(timeout, {"value": "0"})


def abort(conn: psycopg.Connection, version: int, *, lock_timeout: float = 5.0,
          progress: ProgressFn | None = None) -> Migration:
    """Undo a phased migration that is in progress (its ``abort`` phase), in one transaction.

    Raises:
        StateConflict: the migration is not in progress, or has no abort phase (exit 6).
    """
    emit = progress or (lambda event, data: None)
    _take_migrator_lock(conn, 30.0, emit)
    try:
        plan = make_plan(conn)
        status = next((s for s in plan.statuses if s.version == version), None)
        if status is None or status.state != "in_progress":
            raise StateConflict(f"migration {version:04d} is not in progress; nothing to abort",
                                hint="`pgflow migrate status` shows every migration's state")
        migration = next(m for m in available_migrations() if m.version == version)
        phased = migration.phased
        if phased is None or phased.abort is None:
            raise StateConflict(f"migration {migration.label} has no abort phase")
        with transaction(conn, lock_timeout=lock_timeout, statement_timeout=None):
            conn.execute(phased.abort.sql)  # type: ignore[arg-type]  # trusted, shipped SQL
            conn.execute(sqlfiles.statement(QUERIES, "ledger_forget"), {"version": version})
        return migration
    finally:
        if not conn.closed:
            conn.execute(sqlfiles.statement(QUERIES, "migrator_unlock"))


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

"""Migration files and their directives: what ``sql/migrations`` holds and how it is read.

A migration is ``sql/migrations/NNNN_name.sql``. Its text is read through
:mod:`pgflow_cli.sqlfiles` (``--@include`` expanded) and may carry installer directives:
``--@phase``, ``--@online-threshold``, ``--@preflight audit``, ``--@worker-protocol`` and, from
0004 on, ``--@apply`` (docs/architecture.md "Migrations and what they contain").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import psycopg

from pgflow_cli import sqlfiles

_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")
QUERIES = "queries/installer.sql"

RELEASED_CHECKSUMS: dict[str, str] = {
    "migrations/0001_baseline_schema.sql": "24d9b44fbddf8dc55eb2de6cafd03b72a8603f2368a191d7fbf8a6711b2b68a6",
    "migrations/0002_baseline_runtime.sql": "ef9f0294a4248c0e8de1e8ebe1223ea570e239624e8979e7b7c02a915cceef2c",
    "migrations/0003_queue_identity.sql": "b75715a944ab9407ba68f3b906c1fa5dc6a23943ac3455ba90f311f449c3730c",
}
"""SHA-256 of the executed text of every released migration (path below ``sql/`` -> hex digest).

A release adds its migrations here; from then on their text (for migrations that ``--@apply``
function files: their own text, the files by name) may never change."""

PREVIOUS_CHECKSUMS: dict[str, tuple[str, ...]] = {
    # the one-transaction text of 0009 (main up to its phased rewrite, issue 14): identical end state
    "migrations/0009_manual_tasks.sql": ("e318a42e45730e104f6c217d6e31ada17ce95d62724afe3f7ea6fff2b7462dde",),
}
"""Earlier shipped texts of a migration whose text was rewritten without changing what it leaves
behind (path below ``sql/`` -> SHA-256 hex of each earlier text, computed like
:attr:`Migration.checksum`). A ledger row holding one of them counts as that migration applied:
nothing new is recorded for it, and any other checksum is still a mismatch (exit 6).
docs/architecture.md "Rewriting a shipped migration" says when an entry may be added."""

BASELINE_VERSION = 2
"""Last migration of the released baseline (schema + runtime): the state an upgrade starts from."""


_PHASE = re.compile(r"^--@phase[ \t]+(?P<name>[a-z_]+)(?:[ \t]+(?P<mode>tx|batch|notx))?[ \t]*$", re.MULTILINE)
MAX_BATCH_PAGES = 16384
"""Upper bound of one backfill range, heap pages (128 MiB)."""

_APPLY = re.compile(r"^--@apply\b(?P<rest>.*)$", re.MULTILINE)
_APPLY_LINE = re.compile(r"^[ \t]+(?P<path>functions/[a-z0-9_/]+\.sql)[ \t]+sha256=(?P<sha>[0-9a-f]{64})[ \t]*$")
_WORKER_PROTOCOL = re.compile(r"^--@worker-protocol[ \t]+(\d+)[ \t]*$", re.MULTILINE)
_PREFLIGHT = re.compile(r"^--@preflight[ \t]+audit[ \t]*$", re.MULTILINE)
_LOCK = re.compile(r"^--@lock\b(?!-at\b)(?P<rest>.*)$", re.MULTILINE)
_LOCK_AT = re.compile(r"^--@lock-at[ \t]+(?P<statement>\S.*?)[ \t]*$", re.MULTILINE)
_LOCK_LINE = re.compile(r"^[ \t]+(?P<table>[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*)[ \t]+(?P<mode>[A-Z][A-Z ]*[A-Z])[ \t]*$")
_THRESHOLD = re.compile(r"^--@online-threshold[ \t]+(?P<table>[a-z_.]+)[ \t]+(?P<rows>\d+)[ \t]*$", re.MULTILINE)


LOCK_MODES = ("ACCESS SHARE", "ROW SHARE", "ROW EXCLUSIVE", "SHARE UPDATE EXCLUSIVE", "SHARE",
              "SHARE ROW EXCLUSIVE", "EXCLUSIVE", "ACCESS EXCLUSIVE")
"""PostgreSQL's table lock modes, weakest first (``LOCK TABLE ... IN <mode> MODE``)."""

LOCK_CONFLICTS = {
    "ACCESS SHARE": ("ACCESS EXCLUSIVE",),
    "ROW SHARE": ("EXCLUSIVE", "ACCESS EXCLUSIVE"),
    "ROW EXCLUSIVE": ("SHARE", "SHARE ROW EXCLUSIVE", "EXCLUSIVE", "ACCESS EXCLUSIVE"),
    "SHARE UPDATE EXCLUSIVE": ("SHARE UPDATE EXCLUSIVE", "SHARE", "SHARE ROW EXCLUSIVE", "EXCLUSIVE",
                               "ACCESS EXCLUSIVE"),
    "SHARE": ("ROW EXCLUSIVE", "SHARE UPDATE EXCLUSIVE", "SHARE ROW EXCLUSIVE", "EXCLUSIVE", "ACCESS EXCLUSIVE"),
    "SHARE ROW EXCLUSIVE": ("ROW EXCLUSIVE", "SHARE UPDATE EXCLUSIVE", "SHARE", "SHARE ROW EXCLUSIVE", "EXCLUSIVE",
                            "ACCESS EXCLUSIVE"),
    "EXCLUSIVE": ("ROW SHARE", "ROW EXCLUSIVE", "SHARE UPDATE EXCLUSIVE", "SHARE", "SHARE ROW EXCLUSIVE",
                  "EXCLUSIVE", "ACCESS EXCLUSIVE"),
    "ACCESS EXCLUSIVE": LOCK_MODES,
}
"""Which modes each mode conflicts with (PostgreSQL's table-level lock conflict table)."""


def pg_locks_mode(mode: str) -> str:
    """``ROW EXCLUSIVE`` -> ``RowExclusiveLock``: a mode as ``pg_locks.mode`` spells it."""
    return "".join(word.capitalize() for word in mode.split()) + "Lock"

LOCK_ORDER = ("pgflow.flows", "pgflow.steps", "pgflow.runs", "pgflow.step_states", "pgflow.step_tasks",
              "pgflow.workers", "pgflow.worker_functions")
"""The order of a merged lock plan (the order ``--sql`` prints and the first try takes): definitions,
then runs and their states and tasks, then workers. Tables not listed come after, in the order
their ``--@lock`` lines name them. The runtime has no single order (docs/architecture.md "Locks a
migration takes"), so :func:`~pgflow_cli.installer.runner.take_locks` does not rely on this one to
avoid deadlocks; a retry starts with the lock that stood in the way."""


@dataclass(frozen=True)
class TableLock:
    """One ``--@lock TABLE MODE`` line: a lock the runner takes before the transaction's SQL runs.

    Attributes:
        table: ``schema.table`` (lowercase, quoted as two identifiers when locked).
        mode: one of :data:`LOCK_MODES`.
        at: ``None`` for a lock taken before the transaction's SQL; otherwise the first line of the
            statement of the phase text it is taken just before (a ``--@lock-at`` line above it in
            the same phase): a *late* lock, taken on the phased path only (the one-transaction path
            takes every lock up front). :func:`merge_locks` drops it.
    """

    table: str
    mode: str
    at: str | None = None

    @property
    def rank(self) -> int:
        return LOCK_MODES.index(self.mode)


def merge_locks(locks: Sequence[TableLock]) -> tuple[TableLock, ...]:
    """One lock per table, strong enough for every line naming it, in :data:`LOCK_ORDER`.

    ``SHARE`` and ``SHARE UPDATE EXCLUSIVE`` together need ``SHARE ROW EXCLUSIVE`` (the weakest
    mode that conflicts with everything either does); otherwise the stronger mode wins.
    """
    modes: dict[str, set[str]] = {}
    for lock in locks:
        modes.setdefault(lock.table, set()).add(lock.mode)
    merged = []
    for table, found in modes.items():
        mode = max(found, key=LOCK_MODES.index)
        if mode in ("SHARE", "SHARE UPDATE EXCLUSIVE") and {"SHARE", "SHARE UPDATE EXCLUSIVE"} <= found:
            mode = "SHARE ROW EXCLUSIVE"
        merged.append(TableLock(table, mode))
    first_seen = list(modes)

    def position(lock: TableLock) -> tuple[int, int]:
        known = LOCK_ORDER.index(lock.table) if lock.table in LOCK_ORDER else len(LOCK_ORDER)
        return known, first_seen.index(lock.table)

    return tuple(sorted(merged, key=position))


def parse_locks(text: str, label: str) -> dict[str | None, tuple[TableLock, ...]]:
    """The ``--@lock`` lines of a migration (or of its lock file), by phase.

    A ``--@lock-at STATEMENT`` line makes the ``--@lock`` lines after it in the same phase *late*
    locks (:attr:`TableLock.at` = ``STATEMENT``): the runner takes them just before the line of
    the phase text that starts with ``STATEMENT`` (:meth:`Migration.split_at_late_locks`).

    Returns:
        phase name -> its locks (in written order); ``None`` holds the lines before the first
        ``--@phase`` marker (a migration without phases: its one transaction).

    Raises:
        RuntimeError: a malformed line, or a ``--@lock-at`` outside a phase or twice in one
            (a packaging error: the message gives the syntax).
    """
    events = sorted([(m.start(), "phase", m["name"]) for m in _PHASE.finditer(text)]
                    + [(m.start(), "at", m["statement"]) for m in _LOCK_AT.finditer(text)]
                    + [(m.start(), "lock", m.group("rest")) for m in _LOCK.finditer(text)])
    found: dict[str | None, list[TableLock]] = {}
    phase: str | None = None
    at: str | None = None
    seen_at: set[str | None] = set()
    for _, kind, value in events:
        if kind == "phase":
            phase, at = value, None
            continue
        if kind == "at":
            if phase is None or phase in seen_at:
                raise RuntimeError(f"{label}: '--@lock-at {value}' must stand inside a --@phase, once per phase")
            seen_at.add(phase)
            at = value
            continue
        line = _LOCK_LINE.match(value)
        if line is None or line["mode"] not in LOCK_MODES:
            raise RuntimeError(f"{label}: malformed line '--@lock{value}': write '--@lock schema.table MODE' "
                               f"with MODE one of {', '.join(LOCK_MODES)}")
        found.setdefault(phase, []).append(TableLock(line["table"], line["mode"], at))
    return {name: tuple(locks) for name, locks in found.items()}


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
    apply_phases = phases[:-1] if phases[-1].name == "abort" else phases
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
    def accepted_checksums(self) -> tuple[str, ...]:
        """Every checksum a ledger row of this migration may hold: :attr:`checksum` and the
        earlier texts of :data:`PREVIOUS_CHECKSUMS`."""
        return (self.checksum, *PREVIOUS_CHECKSUMS.get(self.path, ()))

    @property
    def applies(self) -> tuple[FileApply, ...]:
        """The function files this migration (re)applies, in order (``--@apply`` lines)."""
        return parse_applies(self.text, self.label)

    @property
    def sql(self) -> str:
        """The text as executed when this migration runs on its own (every ``--@apply`` expanded)."""
        return self.executed()

    def executed(self, skip: frozenset[str] = frozenset()) -> str:
        """The text to execute: each ``--@apply`` line replaced by its file; for the files in
        ``skip`` (a later migration of the same run applies them in full) by
        :func:`create_only`, which keeps of the file only what it creates (the line stays, a comment)."""
        if not self.applies:
            return self.text

        def expand(match: re.Match[str]) -> str:
            path = _APPLY_LINE.match(match.group("rest"))
            assert path is not None  # parse_applies checked every line
            if path["path"] in skip:
                return (f"{match.group(0)} -- runs in full in a later migration of this run; here only if it "
                        f"creates something\n{create_only(path['path'])};")
            return sqlfiles.load(path["path"]).rstrip("\n")

        return _APPLY.sub(expand, self.text)

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"

    @property
    def phased(self) -> PhasedMigration | None:
        return parse_phases(self.sql)

    @property
    def lock_file(self) -> str:
        """Where the ``--@lock`` lines of a released migration that predates them live
        (``migrations/NNNN/locks.sql``; not part of the migration's text or checksum)."""
        return f"migrations/{self.version:04d}/locks.sql"

    @property
    def lock_plan(self) -> dict[str | None, tuple[TableLock, ...]]:
        """The table locks the runner takes first in each transaction of this migration, by phase
        (see :func:`parse_locks`): the migration's own ``--@lock`` lines, or, for a released
        migration written before them, the lines of :attr:`lock_file`."""
        own = parse_locks(self.text, self.label)
        if own or not (sqlfiles.sql_root() / self.lock_file).is_file():
            return own
        return parse_locks(sqlfiles.load(self.lock_file), self.lock_file)

    def locks_for(self, phases: Sequence[str | None]) -> tuple[TableLock, ...]:
        """The locks one transaction running ``phases`` takes up front (merged, in lock order),
        late locks included: the one-transaction path and ``--sql`` take every lock first."""
        plan = self.lock_plan
        return merge_locks([lock for phase in phases for lock in plan.get(phase, ())])

    def phase_locks(self, phase: str) -> tuple[tuple[TableLock, ...], tuple[TableLock, ...]]:
        """The locks of ``phase`` run in its own transaction (the phased path): (taken before its
        SQL, taken late at :attr:`TableLock.at`), each merged and in lock order."""
        plan = self.lock_plan.get(phase, ())
        return (merge_locks([lock for lock in plan if lock.at is None]),
                merge_locks([lock for lock in plan if lock.at is not None]))

    def split_at_late_locks(self, phase: Phase) -> tuple[str, str | None]:
        """``phase``'s executed text cut just before the line its late locks are taken at:
        (head, tail), or (whole text, ``None``) when the phase has no late locks. Head and tail
        run in the same transaction, one after the other: the same statements as the whole text.

        Raises:
            RuntimeError: the statement is not found exactly once at a line start of the phase
                text (a packaging error).
        """
        at = next((lock.at for lock in self.lock_plan.get(phase.name, ()) if lock.at is not None), None)
        if at is None:
            return phase.sql, None
        starts = [m.start() for m in re.finditer(r"^" + re.escape(at), phase.sql, re.MULTILINE)]
        if len(starts) != 1:
            raise RuntimeError(f"{self.label}: '--@lock-at {at}' matches {len(starts)} lines of phase {phase.name}, "
                               "not exactly one")
        return phase.sql[:starts[0]], phase.sql[starts[0]:]

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


CREATE_ONLY_QUOTE = "$pgflow_file$"
"""The dollar quote :func:`create_only` wraps a file's text in (no function file may contain it)."""


def create_only(path: str) -> str:
    """The statement an earlier migration of a run executes for a function file that a later
    migration of the same run applies in full (docs/architecture.md "Function files in a run").

    It runs the file's current text with ``check_function_bodies`` off (the text may name
    columns or functions that only the later migration brings) in a subtransaction, and keeps
    what it did only if it created a function or trigger that did not exist; otherwise it undoes
    it, so an existing function keeps its installed text until the later migration replaces it.
    The migration's own SQL after the line (grants, a trigger) finds every function the file
    creates, with the signature the file has now.

    Args:
        path: the function file below ``sql/`` (``functions/<area>/<name>.sql``).

    Returns:
        One ``DO`` statement (no trailing semicolon).

    Raises:
        RuntimeError: the file's text contains :data:`CREATE_ONLY_QUOTE` (a packaging error).
    """
    text = sqlfiles.load(path).rstrip("\n")
    if CREATE_ONLY_QUOTE in text:
        raise RuntimeError(f"sql/{path} contains {CREATE_ONLY_QUOTE}, which the installer quotes it with")
    template = sqlfiles.statement(QUERIES, "apply_create_only")
    return template.replace("{{path}}", path).replace("{{text}}", f"{CREATE_ONLY_QUOTE}\n{text}\n{CREATE_ONLY_QUOTE}")


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


def versions(migrations: Sequence[Migration]) -> list[int]:
    """Version numbers of ``migrations`` (helper for messages and tests)."""
    return [m.version for m in migrations]

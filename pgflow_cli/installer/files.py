"""Migration files and their directives: what ``sql/migrations`` holds and how it is read.

A migration is ``sql/migrations/NNNN_name.sql``, a literal file: its text is executed as written
(no include is expanded) and its SHA-256 is what the ledger records. Its only directives are
installer comments: ``--@phase``, ``--@lock``, ``--@lock-at``, ``--@online-threshold``,
``--@preflight audit`` and ``--@worker-protocol`` (:data:`DIRECTIVES`). Released migrations
(:data:`RELEASED_CHECKSUMS`) never change; at most one unreleased migration exists, whose
generated sections (:data:`SECTION`) ``scripts/regenerate_migration.py`` rewrites from
``sql/functions`` (docs/architecture.md "SQL layout").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

import psycopg

from pgflow_cli import sqlfiles

_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")
QUERIES = "queries/installer.sql"

RELEASED_CHECKSUMS: dict[str, str] = {
    "migrations/0001_baseline_schema.sql": "24d9b44fbddf8dc55eb2de6cafd03b72a8603f2368a191d7fbf8a6711b2b68a6",
    "migrations/0002_baseline_runtime.sql": "ef9f0294a4248c0e8de1e8ebe1223ea570e239624e8979e7b7c02a915cceef2c",
    "migrations/0003_queue_stage.sql": "8b0772a8dad8d4c44bd773ca0268863e837a15cfb88ffa56ba90f07388274090",
}
"""SHA-256 of the text of every released migration (path below ``sql/`` -> hex digest).

A release adds its migration here; from then on its file never changes, byte for byte."""

BASELINE_VERSION = 2
"""Last migration of the released baseline (schema + runtime): the state an upgrade starts from."""


_PHASE = re.compile(r"^--@phase[ \t]+(?P<name>[a-z_]+)(?:[ \t]+(?P<mode>tx|batch|notx))?[ \t]*$", re.MULTILINE)
MAX_BATCH_PAGES = 16384
"""Upper bound of one backfill range, heap pages (128 MiB)."""

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
migration takes"), so :func:`~pgflow_cli.installer.locks.take_locks` does not rely on this one to
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
            heap in page ranges, each range its own transaction) or ``notx`` (statements run one by
            one outside any transaction, e.g. ``CREATE INDEX CONCURRENTLY``; an optimisation only:
            the final phase must reach the same state on its own).
        sql: the phase's text.
    """

    name: str
    mode: str
    sql: str

    @property
    def statements(self) -> list[str]:
        """The phase's statements, each on its own (what a ``notx`` phase runs one by one): the text
        split at every ``;`` that ends a line. A ``notx`` phase holds plain DDL (no quoted ``;``)."""
        parts = re.split(r";[ \t]*(?:\n|$)", self.sql)
        return [_without_leading_comments(part) for part in parts if _code(part)]


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


def _without_leading_comments(text: str) -> str:
    """``text`` from its first line of SQL on (so ``pg_stat_activity`` shows the statement itself)."""
    lines = text.strip().splitlines()
    while lines and (not lines[0].strip() or lines[0].lstrip().startswith("--")):
        lines.pop(0)
    return "\n".join(lines)


def _code(text: str) -> bool:
    """True when ``text`` holds more than comments and blank lines."""
    return any(line.strip() and not line.strip().startswith("--") for line in text.splitlines())


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
    """

    version: int
    name: str
    path: str

    @property
    def text(self) -> str:
        """The file's text, executed as written."""
        return _read(self.path)

    @property
    def sql(self) -> str:
        """The text as executed (the same as :attr:`text`: a migration is literal)."""
        return self.text

    @property
    def checksum(self) -> str:
        """SHA-256 of :attr:`text`: what the ledger records for this migration."""
        return sqlfiles.checksum(self.text)

    @property
    def released(self) -> bool:
        """True when :data:`RELEASED_CHECKSUMS` lists it (its text never changes again)."""
        return self.path in RELEASED_CHECKSUMS

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"

    @property
    def phased(self) -> PhasedMigration | None:
        return parse_phases(self.sql)

    @property
    def lock_plan(self) -> dict[str | None, tuple[TableLock, ...]]:
        """The table locks the runner takes first in each transaction of this migration, by phase
        (its ``--@lock`` lines, see :func:`parse_locks`)."""
        return parse_locks(self.text, self.label)

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
        """``phase``'s text cut just before the line its late locks are taken at: (head, tail), or
        (whole text, ``None``) when the phase has no late locks. Head and tail run in the same
        transaction, one after the other: the same statements as the whole text.

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

    def phases_for_single_transaction(self) -> list[Phase]:
        """What runs when the whole migration is one transaction (``notx`` phases skipped)."""
        phased = parse_phases(self.text)
        if phased is None:
            return [Phase("main", "tx", self.text)]
        return [p for p in phased.apply_phases if p.mode != "notx"]

    def section(self, name: str) -> str:
        """The text between the ``-- >>> name`` and ``-- <<< name`` lines (the first such pair).

        Raises:
            RuntimeError: the migration has no such section (a packaging error).
        """
        for found, body in sections(self.text):
            if found == name:
                return body
        raise RuntimeError(f"{self.label} has no section {name!r} (lines '-- >>> {name}' ... '-- <<< {name}')")


DIRECTIVES = ("--@phase", "--@lock", "--@lock-at", "--@online-threshold", "--@preflight", "--@worker-protocol")
"""The only directives a migration holds (each on a line of its own); everything else is SQL."""

SECTION = re.compile(r"^-- >>> (?P<name>[a-z]+)\b[^\n]*\n(?P<body>.*?)^-- <<< (?P=name)[ \t]*$",
                     re.MULTILINE | re.DOTALL)
"""A marked section of a migration: ``-- >>> NAME`` (the rest of the line says what writes it),
its text, ``-- <<< NAME``. ``scripts/regenerate_migration.py`` rewrites the generated ones (recheck,
types, functions); the installer runs the ``additions``, ``functions`` and ``grants`` sections of the
unreleased migration on their own when it converts a ledger of an earlier build
(:mod:`~pgflow_cli.installer.old_levels`)."""


def sections(text: str) -> list[tuple[str, str]]:
    """``(name, body)`` of every marked section of ``text``, in order (a name may repeat)."""
    return [(match["name"], match["body"]) for match in SECTION.finditer(text)]


def replace_sections(text: str, bodies: dict[str, str]) -> str:
    """``text`` with the body of every section named in ``bodies`` replaced (all of a repeated
    name); the marker lines stay as they are. A body gets exactly one trailing newline."""

    def replace(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in bodies:
            return match.group(0)
        whole = match.group(0)
        head = whole[:whole.index("\n") + 1]
        body = bodies[name].strip("\n")
        return f"{head}{body}\n-- <<< {name}" if body else f"{head}-- <<< {name}"

    return SECTION.sub(replace, text)


RECHECK = """\
DO $recheck$
DECLARE
  v_count integer;
  v_detail text;
BEGIN
  SELECT pg_catalog.count(*)::integer,
         pg_catalog.string_agg(pg_catalog.format('%s %s: %s [%s]', f.check_id, f.object_name, f.message,
                                                 pg_catalog.array_to_string(f.reasons, ', ')),
                               E'\\n' ORDER BY f.flow_slug, f.check_id, f.object_name)
  INTO v_count, v_detail
  FROM (
{findings}
  ) AS f
  WHERE f.blocking;
  IF v_count > 0 THEN
    RAISE EXCEPTION USING
      ERRCODE = 'PF005',
      MESSAGE = pg_catalog.format('pgflow queue-stage upgrade refused: %s incompatible definition(s) found under '
                                  || 'the migration''s locks; this transaction was rolled back', v_count),
      DETAIL = v_detail,
      HINT = 'run `pgflow audit` for the report with fixes: a rejected name needs a new concrete flow under a '
             || 'compliant slug; pgflow never renames or deletes flows. On the phased path, rerun `pgflow migrate '
             || 'apply` afterwards to finish, or `pgflow migrate abort {version}` to undo the prepared phases';
  END IF;
END
$recheck$;"""
"""The ``recheck`` section of a migration marked ``--@preflight audit`` (:func:`recheck_block`)."""


def recheck_block(version: int) -> str:
    """The blocking rules of the current audit (``sql/audit/findings.sql``) as one ``DO`` statement
    that raises PF005 with every finding: the ``recheck`` section ``scripts/regenerate_migration.py``
    writes into migration ``version``, and what the installer runs under the locks of a
    ``--@preflight audit`` migration whose text holds an older one (a released migration keeps the
    rules it shipped with)."""
    findings = "\n".join(("    " + line) if line else ""
                         for line in sqlfiles.load("audit/findings.sql").rstrip("\n").split("\n"))
    return RECHECK.format(findings=findings, version=version)


@cache
def _read(path: str) -> str:
    """A migration's text, read once per process (the files of an installed tool do not change)."""
    return sqlfiles.read_file(path)


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

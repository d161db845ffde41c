"""Adopt a schema that a published pgflow release installed: bring it to pgflow-cli's baseline in place.

The adoption is a step of the installer's engine (:class:`Adoption`): one transaction of three
parts, all shipped SQL:

1. ``sql/adoption/schema.sql``: locks the tables, drops the functions pgflow-cli's baseline
   replaces (remembering their grants), adds the missing columns, constraints and index with
   the baseline's names, types and defaults, and backfills step outputs where the release did
   not store them (what 0.13.0 did);
   then the result is compared with the baseline's frozen shape (:mod:`pgflow_cli.installer.shapes`):
   what the runtime needs and is still missing or changed (a column dropped or narrowed by hand) is
   mended where that keeps every row, and anything else refuses the adoption (exit 1) with the
   list, rolling the whole transaction back; ``--assume-release`` changes nothing about that;
2. pgflow-cli's baseline functions, from the very files the baseline migrations run
   (:func:`baseline_function_sql`): no second copy of any function exists;
3. ``sql/adoption/finish.sql``: the slug checks again, the remembered grants on the new
   functions (nothing else granted), PUBLIC revoked, and the adoption record;

then the ledger rows of migrations 0001 and 0002 (the engine's ledger loop), so the installer
continues with 0003 as on any baseline database. Every row of every table is kept. A lock
timeout or deadlock rolls the whole transaction back and it is retried; a killed client leaves
the database as it was.

On a large database (:data:`ONLINE_THRESHOLD_BYTES`) the transaction backfills only the step
outputs the runtime reads (runs in flight); the index, the constraint validations and, last,
the **history backfill** (the stored outputs of finished runs; ``get_run_with_states``
computes them from their tasks since migration 0003) run after the commit in short
transactions (:class:`Completion`, another step), recorded in ``pgflow.schema_adoption.pending``
so a rerun resumes. ``pgflow migrate apply`` runs the history backfill only with
``--fill-history``, after the migrations.

Spec: issue 8 "Adoption"; fact sheet ``upstream-releases.md`` §4.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import ClientCursor
from psycopg import sql as pgsql
from psycopg.types.json import Jsonb

from pgflow_cli import __version__, installer, sqlfiles
from pgflow_cli.db import scalar
from pgflow_cli.errors import Refused, StateConflict
from pgflow_cli.installer import (
    Engine,
    LedgerEntry,
    Migration,
    Options,
    Outcome,
    ProgressFn,
    Session,
    TableLock,
    shapes,
)
from pgflow_cli.installer.catalog import SCHEMA_KINDS, Difference, Shape, read_schema_facts
from pgflow_cli.installer.events import PhaseDone, PhaseStarted, StepStarted
from pgflow_cli.upstream import recognise as rec
from pgflow_cli.upstream import releases
from pgflow_cli.upstream.releases import REPLACED_BY

QUERIES = "queries/adopt.sql"
SCHEMA_FILE = "adoption/schema.sql"
FINISH_FILE = "adoption/finish.sql"

ADOPTION_LOCKS = tuple(TableLock(f"pgflow.{table}", "ACCESS EXCLUSIVE") for table in (
    "flows", "steps", "deps", "runs", "step_states", "step_tasks", "workers", "worker_functions"))
"""What the adoption transaction locks before its SQL runs, all or none
(:func:`pgflow_cli.installer.take_locks`); ``worker_functions`` only where the
release has it. ``sql/adoption/schema.sql`` locks the same tables again (already held) so its text
also stands alone in ``--sql``."""


def adoption_locks(conn: psycopg.Connection) -> tuple[TableLock, ...]:
    """:data:`ADOPTION_LOCKS` for this database (without ``pgflow.worker_functions`` when the release
    that installed it has no such table)."""
    row = conn.execute(sqlfiles.statement(QUERIES, "has_worker_functions")).fetchone()
    has_worker_functions = bool(row and row[0])
    return tuple(lock for lock in ADOPTION_LOCKS if has_worker_functions or lock.table != "pgflow.worker_functions")

_FUNCTION_STATEMENT = re.compile(r"^CREATE FUNCTION pgflow\.[\s\S]*?\bAS \$\$[\s\S]*?\$\$;", re.MULTILINE)
_FUNCTION_NAME = re.compile(r"^CREATE (?:OR REPLACE )?FUNCTION pgflow\.([a-z_][a-z0-9_]*)\(", re.MULTILINE)


def _baseline_migrations() -> list[Migration]:
    return [m for m in installer.available_migrations() if m.version <= installer.BASELINE_VERSION]


def baseline_function_sql() -> str:
    """pgflow-cli's baseline function definitions, exactly as the baseline migrations create them.

    Every ``CREATE FUNCTION`` statement of the schema migration (0001 holds the tables and
    two functions) followed by the whole runtime migration (0002 creates functions only).

    Returns:
        SQL text (several statements).
    """
    schema, runtime = _baseline_migrations()
    return "\n\n".join(_FUNCTION_STATEMENT.findall(schema.sql)) + "\n\n" + runtime.sql


def baseline_function_names() -> tuple[str, ...]:
    """Names of the functions :func:`baseline_function_sql` creates, sorted."""
    return tuple(sorted(set(_FUNCTION_NAME.findall(baseline_function_sql()))))


OPTIONAL_FILES = {"prune_data_older_than": "optional/prune_baseline.sql"}
"""pgflow-cli's version of each optional function pgflow's docs ship (installed only where one was)."""


def replaced_functions(optional: tuple[str, ...] = ()) -> dict[str, str | None]:
    """``{function name: replacing name or None}``: what part 1 drops (any signature).

    Every function named like one of the baseline's (``None``: replaced by its namesake), the
    upstream functions the baseline replaces under another name (:data:`REPLACED_BY`), and the
    installed optional functions (``optional``, replaced by :data:`OPTIONAL_FILES`).
    """
    names: dict[str, str | None] = {name: None for name in baseline_function_names()}
    names.update(REPLACED_BY)
    names.update({name: None for name in optional})
    return names


@dataclass(frozen=True)
class AdoptionPart:
    """One part of the adoption transaction, for ``--sql`` and progress.

    Attributes:
        label: ``adoption/schema.sql``, ``baseline functions`` ...
        sql: the text executed.
    """

    label: str
    sql: str


def adoption_parts(conn: psycopg.Connection, recognition: rec.Recognition) -> list[AdoptionPart]:
    """The statements of the adoption, in order, as they are executed (``--sql`` prints them).

    ``conn`` is used only to quote the list of replaced functions (no query is sent).
    """
    replaced = replaced_functions(recognition.optional)
    cursor = ClientCursor(conn)
    rows = cursor.mogrify(sqlfiles.statement(QUERIES, "replaced_rows"),
                          {"names": list(replaced), "replaced_by": list(replaced.values())})
    return [
        AdoptionPart("replaced functions", sqlfiles.statement(QUERIES, "replaced_table") + ";\n" + rows + ";"),
        AdoptionPart(SCHEMA_FILE, sqlfiles.load(SCHEMA_FILE)),
        AdoptionPart("baseline functions (migrations 0001 and 0002)", baseline_function_sql()),
        *[AdoptionPart(OPTIONAL_FILES[name], sqlfiles.load(OPTIONAL_FILES[name])) for name in recognition.optional],
        AdoptionPart(FINISH_FILE, sqlfiles.load(FINISH_FILE)),
    ]


def adoption_checksum(parts: list[AdoptionPart]) -> str:
    """SHA-256 of the adoption text as executed (recorded with the adoption)."""
    return sqlfiles.checksum("\n".join(p.sql for p in parts))


@dataclass(kw_only=True)
class Adopted(Outcome):
    """What :class:`Adoption` did.

    Attributes:
        release: the release recorded (the newest member of the recognised group, or the one
            the operator asserted).
        releases: the recognised group.
        assumed: the operator asserted the release (the schema was not recognised).
        differences: what differed from that release (empty when recognised).
        mended: what the runtime needed and the schema lacked, mended in the adoption (one line each).

    ``online``: the index and the validations ran after the commit (:class:`Completion`).
    """

    release: str
    releases: tuple[str, ...]
    assumed: bool
    differences: list[dict[str, Any]]
    mended: list[str] = dataclasses.field(default_factory=list)


@dataclass(kw_only=True)
class Completed(Outcome):
    """What :class:`Completion` did.

    Attributes:
        steps: completion steps done (index, each validation, the history backfill).
        history: the history backfill was one of them.
    """

    steps: int
    history: bool


def check_adoptable(recognition: rec.Recognition) -> None:
    """Refuse what adoption must not touch.

    Raises:
        StateConflict: the schema is unrecognised and no release was asserted (exit 6), with
            every difference from the nearest release in ``detail``; or it is not an upstream
            schema at all.
    """
    if recognition.adoptable:
        return
    if recognition.status == rec.UNRECOGNISED:
        raise StateConflict(
            f"this pgflow schema matches no published release: it differs from the nearest, pgflow "
            f"{recognition.label}, in {len(recognition.differences)} place(s)",
            hint="nothing was changed. If you know which release installed it and the differences are yours, "
                 f"rerun with --assume-release {recognition.release} (recorded with the adoption); docs/upgrade.md",
            detail=[d.describe() for d in recognition.differences],
        )
    raise StateConflict(f"nothing to adopt: {recognition.summary()}",
                        hint="`pgflow migrate status` shows what is installed")


HISTORY_STEP = "backfill"
"""The pending completion step of the history backfill (outputs of finished runs), run last."""

ONLINE_THRESHOLD_BYTES = 8 * 1024 * 1024
"""Heap size of step_states + step_tasks above which adoption finishes online (about 40,000
step states: the step output backfill rewrites each completed one, which inside the locked
transaction would block workers for about a second per 50,000 rows)."""

COMPLETION_LABEL = "adoption (online completion)"


def adoption_label(recognition: rec.Recognition) -> str:
    """``adoption of pgflow 0.8.0/0.8.1/0.9.0/0.9.1``: how progress and results name the step."""
    return f"adoption of pgflow {recognition.release if recognition.assumed else recognition.label}"


def large(conn: psycopg.Connection) -> bool:
    """True when the runtime tables are larger than :data:`ONLINE_THRESHOLD_BYTES` (no scan)."""
    row = conn.execute(sqlfiles.statement(QUERIES, "runtime_bytes")).fetchone()
    return bool(row and int(row[0]) > ONLINE_THRESHOLD_BYTES)


class Adoption:
    """The adoption of the upstream schema recognised as ``recognition``: a step of the installer's
    engine (see the module docstring).

    The adoption itself is one transaction: before it commits the database is the release, after
    it the baseline runtime runs it. On a small database that transaction also checks every
    existing row against the new constraints, builds the new index and backfills every step
    output. On a large one (:attr:`~pgflow_cli.installer.Options.online`), it leaves those three
    for after the commit, where they run without blocking workers (:class:`Completion`, run at
    once but for the history backfill): constraints are NOT VALID until validated, and only the
    outputs of runs in flight are backfilled inside the transaction. The history backfill
    (finished runs) is left pending for ``Completion(history=True)`` once the migrations after
    the baseline are applied (``pgflow migrate apply --fill-history``).

    Rendered (``--sql``) it is for review only: it starts with a recheck of the catalog under its
    locks that only the tool makes, and the tool reads which constraints its text added NOT VALID.

    Args:
        recognition: what :func:`~pgflow_cli.upstream.recognise.recognise` found; it is checked
            again inside the transaction and a change refuses the adoption.
        assume_release: the release the operator asserted (``--assume-release``), for the recheck.

    Raises:
        StateConflict: not adoptable (:func:`check_adoptable`), or the schema changed between
            the plan and the locked recheck (exit 6).
        LockTimeout: a lock could not be taken within the retries (exit 4).
    """

    def __init__(self, recognition: rec.Recognition, *, assume_release: str | None = None) -> None:
        self.recognition = recognition
        self.assume_release = assume_release
        self.label = adoption_label(recognition)

    def run(self, engine: Engine) -> list[Outcome]:
        recognition = self.recognition
        check_adoptable(recognition)
        # a table of the release that is gone cannot be locked, let alone mended: refused before the locks
        _refuse_unmended(recognition, [shapes.describe(d) for d in recognition.differences
                                       if d.kind == "table" and d.change == "missing"])
        conn, options = engine.conn, engine.options
        parts = adoption_parts(conn, recognition)
        checksum = adoption_checksum(parts)
        release = recognition.release
        assert release is not None
        use_online = not engine.rendering and not options.dry_run and (
            options.online == "always" or (options.online == "auto" and large(conn)))
        if engine.rendering:
            engine.review_only(
                f"adopt pgflow {recognition.release if recognition.assumed else recognition.label} with "
                "`pgflow migrate apply`",
                "this database was installed by a pgflow release: its adoption cannot be printed as a script psql "
                "runs as is (it starts with a recheck, under its locks, that the catalog is still the release the "
                "tool recognised, and the tool reads which constraints its text added NOT VALID to validate them); "
                "the text below is commented out, for review only; adopt it with `pgflow migrate apply`, then "
                "`--sql` prints the migrations after it")

        def body(session: Session) -> None:
            if session.executing:
                _recheck(conn, recognition, self.assume_release)
            else:
                session.comment("the tool checks, under these locks, that the catalog is still what it recognised: "
                                + recognition.summary())
            had_output = bool(scalar(conn.execute(sqlfiles.statement(QUERIES, "has_output_column"))))
            before = set(_unvalidated(session))
            if session.executing:
                mended.extend(_mend_release_columns(conn, recognition))
            for part in parts:
                session.comment(f"==== {part.label}")
                session.run(part.sql)  # shipped SQL (and quoted literals)
            if session.executing:
                mended.extend(_mend_baseline(conn, recognition))
            else:
                session.comment("the tool compares the result with the baseline's shape (sql/shapes/baseline.json), "
                                "mends what keeps every row and refuses the rest")
            if not had_output:
                session.comment("the 0.13.0 step output backfill: every completed step" + (
                    ", of the runs in flight only" if use_online else ""))
                session.backfill("step outputs", sqlfiles.statement(QUERIES, "step_output_backfill"),
                                 {"in_flight_only": use_online})
            added = [c for c in _unvalidated(session) if c not in before]
            pending: list[dict[str, Any]] = []
            if use_online:
                pending = [{"step": "index"}, *[{"step": "validate", "table": t, "constraint": c} for t, c in added],
                           *([] if had_output else [{"step": HISTORY_STEP, "next_page": 0}])]
            else:
                session.comment("each constraint added NOT VALID above is validated (the tool reads which from the "
                                "catalog): " + sqlfiles.statement(QUERIES, "validate_constraint").splitlines()[-1])
                for table, constraint in added:
                    session.run(_validate_statement(table, constraint))
                session.run(sqlfiles.statement(QUERIES, "skipped_index"))
            session.comment("the adoption record")
            session.run(sqlfiles.statement(QUERIES, "adoption_insert"), _adoption_record(recognition, checksum, pending))

        mended: list[str] = []
        tally = engine.tally(self.label)
        engine.transaction(tally, adoption_locks(conn), body, announce=True, heading=self.label,
                           ledger=[LedgerEntry(m) for m in _baseline_migrations()])
        outcomes: list[Outcome] = [Adopted(release=release, releases=recognition.releases,
                                           assumed=recognition.assumed,
                                           differences=[d.to_dict() for d in recognition.differences],
                                           mended=mended,
                                           **engine.outcome(tally, online=use_online))]
        if use_online:
            outcomes += Completion(history=False).run(engine)
        return outcomes


def adopt(conn: psycopg.Connection, recognition: rec.Recognition, *, lock_timeout: float = 5.0,
          attempts: int = 5, dry_run: bool = False, progress: ProgressFn | None = None,
          before_commit: Callable[[psycopg.Connection], None] | None = None,
          assume_release: str | None = None, online: str = "auto", batch_seconds: float = 0.2) -> Adopted:
    """Run :class:`Adoption` on its own (under the migrators' lock): what ``pgflow migrate apply``
    runs before the migrations.

    Args:
        conn: an autocommit connection.
        recognition: what :func:`~pgflow_cli.upstream.recognise.recognise` found.
        lock_timeout: seconds the transaction keeps trying for its locks, per attempt.
        attempts: tries on lock timeouts and deadlocks.
        dry_run: run the transaction (everything in it, as on a small database), then roll back.
        progress: receives the events (:mod:`pgflow_cli.installer.events`).
        before_commit: called inside the transaction just before it commits (or rolls back).
        assume_release: the release the operator asserted (``--assume-release``), for the recheck.
        online: ``auto`` (online above :data:`ONLINE_THRESHOLD_BYTES`), ``always`` or ``never``.
        batch_seconds: time each backfill batch of the online completion aims at, seconds.

    Returns:
        :class:`Adopted`.
    """
    def hook(conn: psycopg.Connection, label: str) -> None:
        if before_commit is not None:
            before_commit(conn)

    options = Options(lock_timeout=lock_timeout, attempts=attempts, dry_run=dry_run, online=online,
                      batch_seconds=batch_seconds, before_commit=hook)
    outcome = installer.run(conn, [Adoption(recognition, assume_release=assume_release)], options, progress)[0]
    assert isinstance(outcome, Adopted)
    return outcome


def pending_completion(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """What an online adoption still has to do after its commit (empty: nothing, or no adoption).

    Returns:
        The pending steps in order: ``{"step": "index"}``, ``{"step": "validate", "table",
        "constraint"}``, ``{"step": "backfill", "next_page": n}`` (the history backfill, resumed
        at heap page ``n`` of step_states).
    """
    if rec.read_facts(conn).context.get("adoption_record") != "present":
        return []
    row = conn.execute(sqlfiles.statement(QUERIES, "adoption_pending")).fetchone()
    return list(row[0]) if row else []


@dataclass(frozen=True)
class HistoryBackfill:
    """How far the history backfill (outputs of finished runs) of an online adoption is.

    Attributes:
        next_page: the step_states heap page it continues at.
        pages: heap pages of step_states now (it grows while the backfill runs).
    """

    next_page: int
    pages: int

    def describe(self) -> str:
        """``page 120 of 4000``."""
        return f"page {min(self.next_page, self.pages)} of {self.pages}"


def history_pending(conn: psycopg.Connection) -> HistoryBackfill | None:
    """The history backfill still to run, or ``None`` (done, or never needed). Reads the record
    and the relation size only (no scan)."""
    step = next((s for s in pending_completion(conn) if s["step"] == HISTORY_STEP), None)
    if step is None:
        return None
    pages = scalar(conn.execute(sqlfiles.statement(QUERIES, "step_states_pages")))
    return HistoryBackfill(int(step.get("next_page", 0)), int(pages or 0))


class Completion:
    """The online completion of an adoption, after its commit; resumable (each step is recorded
    in ``pgflow.schema_adoption.pending`` in the transaction that does it).

    Steps, in order, none of which blocks workers for longer than one short batch:

    * ``index``: ``CREATE INDEX CONCURRENTLY`` of the baseline's skipped-steps index;
    * ``validate``: ``VALIDATE CONSTRAINT`` of each constraint adoption added NOT VALID, each in
      its own transaction (SHARE UPDATE EXCLUSIVE: reads and writes go on);
    * ``backfill`` (only with ``history``): the step output backfill of finished runs, a range of
      step_states heap pages per transaction, sized so a batch takes about ``batch_seconds`` (its
      rows stay locked that long; they belong to finished runs, which no worker touches). Each
      batch records the page it reached in the same transaction, so a killed client loses at
      most one batch; a last pass over the whole table catches rows a table rewrite moved.
      Until it is done, ``get_run_with_states`` shows ``output`` null for the completed steps
      of finished runs (their tasks keep their outputs); nothing the runtime reads is missing.

    Args:
        history: also run the history backfill (``pgflow migrate apply --fill-history`` runs it
            after the migrations, so the upgrade is not kept waiting by it).

    Raises:
        LockTimeout: a lock could not be taken within the retries (exit 4); rerun to resume.
        psycopg.errors.CheckViolation: an existing row breaks a baseline constraint (the
            constraint stays NOT VALID; rerun after fixing the row).
    """

    label = COMPLETION_LABEL

    def __init__(self, *, history: bool) -> None:
        self.history = history

    def run(self, engine: Engine) -> list[Outcome]:
        if engine.rendering:
            raise RuntimeError("an adoption's online completion runs outside one transaction; it is not rendered")
        pending = pending_completion(engine.conn)
        todo = [s for s in pending if self.history or s["step"] != HISTORY_STEP]
        if not todo:
            return []
        tally = engine.tally(COMPLETION_LABEL)
        engine.emit(StepStarted(COMPLETION_LABEL, 1, True))
        for step in todo:
            left = [s for s in pending if s is not step]
            mode = "online, in batches; the migrations are committed" if step["step"] == HISTORY_STEP else "online"
            engine.emit(PhaseStarted(COMPLETION_LABEL, step["step"], mode))
            started = time.monotonic()
            if step["step"] == HISTORY_STEP:
                _history(engine, tally, pending, step, left)
            elif step["step"] == "index":
                engine.concurrently(tally, [sqlfiles.statement(QUERIES, "skipped_index_concurrently")],
                                    "the adoption's index build")
                def done(session: Session, left: list[dict[str, Any]] = left) -> None:
                    _record_pending(session, left)

                engine.transaction(tally, (), done, final=False)
            else:
                def validate(session: Session, step: dict[str, Any] = step, left: list[dict[str, Any]] = left) -> None:
                    session.run(_validate_statement(step["table"], step["constraint"]))
                    _record_pending(session, left)

                engine.transaction(tally, (TableLock(f"pgflow.{step['table']}", "SHARE UPDATE EXCLUSIVE"),), validate,
                                   final=False)
            pending = left
            engine.emit(PhaseDone(COMPLETION_LABEL, step["step"], int((time.monotonic() - started) * 1000)))
        history = any(s["step"] == HISTORY_STEP for s in todo)
        return [Completed(steps=len(todo), history=history, **engine.outcome(tally, online=True))]


HISTORY_FIRST_PAGES = 256
"""Heap pages of the history backfill's first batch (later ones adapt to ``batch_seconds``)."""


def _history(engine: Engine, tally: installer.Tally, pending: list[dict[str, Any]], step: dict[str, Any],
             left: list[dict[str, Any]]) -> None:
    """The history backfill in batches from the recorded page; ``step`` (an item of ``pending``)
    is updated with the page reached, recorded with each batch. Then one pass over every page
    (rows whose page was passed can only be missing if a rewrite, VACUUM FULL or CLUSTER, moved
    them; rows with an output are skipped), recorded done in the same transaction."""
    statement = sqlfiles.statement(QUERIES, "step_output_backfill")

    def reached(session: Session, next_page: int) -> None:
        step["next_page"] = next_page
        _record_pending(session, pending)

    engine.batches(tally, HISTORY_STEP, statement, params={"in_flight_only": False},
                   first_page=int(step.get("next_page", 0)), pages=HISTORY_FIRST_PAGES, bounded=False, record=reached)

    def sweep(session: Session) -> None:
        session.backfill(HISTORY_STEP, statement, {"in_flight_only": False})
        _record_pending(session, left)

    engine.transaction(tally, (), sweep, final=False)


def complete(conn: psycopg.Connection, *, lock_timeout: float = 5.0, attempts: int = 5,
             progress: ProgressFn | None = None, batch_seconds: float = 0.2, history: bool = True) -> int:
    """Run :class:`Completion` on its own (under the migrators' lock).

    Returns:
        How many steps were done (0 when nothing was pending).
    """
    options = Options(lock_timeout=lock_timeout, attempts=attempts, batch_seconds=batch_seconds)
    outcomes = installer.run(conn, [Completion(history=history)], options, progress)
    return sum(o.steps for o in outcomes if isinstance(o, Completed))


def _mend(conn: psycopg.Connection, expected: Shape, kinds: tuple[str, ...],
          later: frozenset[str] = frozenset()) -> tuple[list[str], list[str]]:
    """Mend, under a savepoint each, the runtime breaks of the ``kinds`` of pgflow's schema against
    ``expected`` where that keeps every row (:func:`pgflow_cli.installer.shapes.repairs`); the objects
    named in ``later`` are left alone (the adoption builds them itself, after this).

    Returns:
        ``(mended, left)``: one line per break mended, one per break still there (with why a mend failed).
    """
    def breaks() -> list[Difference]:
        found = read_schema_facts(conn)
        return [d for d in shapes.runtime_breaks({k: expected.get(k, {}) for k in kinds}, {k: found[k] for k in kinds})
                if d.name not in later]

    found_breaks = breaks()
    if not found_breaks:
        return [], []
    rows = {t: bool(scalar(conn.execute(pgsql.SQL("SELECT EXISTS (SELECT FROM {})").format(pgsql.Identifier("pgflow", t)))))
            for t in read_schema_facts(conn)["table"]}
    mended: list[str] = []
    failed: dict[str, str] = {}
    pending = found_breaks
    for _ in range(3):  # a foreign key waits for the key it references: a later pass mends it
        failed, progress = {}, False
        for difference in pending:
            statements = shapes.repairs(difference, rows)
            if not statements:
                continue
            try:
                with conn.transaction():  # a savepoint: a mend the data refuses leaves nothing behind
                    for statement in statements:
                        conn.execute(statement)
            except psycopg.Error as exc:
                failed[difference.name] = str(exc).splitlines()[0]
            else:
                mended.append(shapes.describe(difference))
                progress = True
        pending = [d for d in pending if d.name in failed]
        if not pending or not progress:
            break
    return mended, [shapes.describe(d) + (f" (mending failed: {failed[d.name]})" if d.name in failed else "")
                    for d in breaks()]


def _refuse_unmended(recognition: rec.Recognition, left: list[str]) -> None:
    """Refuse the adoption (exit 1) when ``left`` lists breaks that could not be mended.

    Raises:
        Refused: with every break; the caller's transaction rolls back, so nothing is adopted.
    """
    if not left:
        return
    raise Refused(
        f"this pgflow {recognition.release} schema lacks what the runtime needs in {len(left)} place(s) that adoption "
        "cannot mend without losing or inventing data; nothing was adopted"
        + (" (--assume-release does not override this)" if recognition.assumed else ""),
        hint="restore each object as the release created it (from a backup, or the release's migration), then apply "
             "again; a missing column of an empty table, a missing index or constraint, a lost default or NOT NULL, "
             "and a text column narrowed to varchar are mended automatically (docs/upgrade.md)",
        detail=left)


def _mend_release_columns(conn: psycopg.Connection, recognition: rec.Recognition) -> list[str]:
    """Before the adoption's SQL (which reads the release's tables and columns): mend the columns of the
    release that were dropped or changed by hand, or refuse (a missing table too). Constraints and
    indexes are checked after it, against the baseline (:func:`_mend_baseline`): the adoption's SQL
    re-adds many of them."""
    index = releases.group_of(recognition.release) if recognition.release else None
    if index is None:
        return []
    release = releases.shape(index)
    mended, left = _mend(conn, {"table": release["table"], "column": release["column"]}, ("table", "column"))
    _refuse_unmended(recognition, left)
    return mended


def _mend_baseline(conn: psycopg.Connection, recognition: rec.Recognition) -> list[str]:
    """After the adoption's SQL: mend what the baseline's runtime needs and is still missing or changed,
    or refuse; the index the adoption builds itself next (in the transaction, or concurrently after
    it on a large database) is left to it."""
    built_later = frozenset(re.findall(r"CREATE INDEX IF NOT EXISTS (\w+)", sqlfiles.statement(QUERIES, "skipped_index")))
    mended, left = _mend(conn, shapes.shape("baseline"), SCHEMA_KINDS, built_later)
    _refuse_unmended(recognition, left)
    return mended


def _record_pending(session: Session, pending: list[dict[str, Any]]) -> None:
    session.run(sqlfiles.statement(QUERIES, "adoption_progress"), {"pending": Jsonb(pending)})


def _unvalidated(session: Session) -> list[tuple[str, str]]:
    """The NOT VALID check constraints of pgflow (table, constraint); nothing when rendering (the
    text has not run: the tool reads them)."""
    if not session.executing:
        return []
    return [(str(t), str(c)) for t, c in session.fetch(sqlfiles.statement(QUERIES, "unvalidated_constraints"))]


def _validate_statement(table: str, constraint: str) -> pgsql.Composed:
    return pgsql.SQL(sqlfiles.statement(QUERIES, "validate_constraint")).format(
        table=pgsql.Identifier(table), constraint=pgsql.Identifier(constraint))


def _recheck(conn: psycopg.Connection, planned: rec.Recognition, assume_release: str | None) -> None:
    now = rec.recognise(conn, assume_release=assume_release)
    if (now.status, now.releases, now.differences) != (planned.status, planned.releases, planned.differences):
        raise StateConflict(
            "the pgflow schema changed since it was recognised; nothing was adopted",
            hint="run `pgflow migrate plan` again",
            detail=[f"planned: {planned.summary()}", f"now: {now.summary()}"],
        )


def _adoption_record(recognition: rec.Recognition, checksum: str, pending: list[dict[str, Any]]) -> dict[str, Any]:
    """The values of the adoption record (``adoption_insert``)."""
    return {
        "release": recognition.release,
        "releases": list(recognition.releases),
        "assumed": recognition.assumed,
        "differences": Jsonb([d.to_dict() for d in recognition.differences]),
        "cron_jobs": Jsonb([j.to_dict() for j in recognition.cron_jobs]),
        "supabase_history": Jsonb(recognition.supabase.to_dict()) if recognition.supabase else None,
        "checksum": checksum,
        "tool_version": __version__,
        "pending": Jsonb(pending),
        "complete": not pending,
    }

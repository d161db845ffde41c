"""The installer's own steps, run by the engine (:mod:`~pgflow_cli.installer.engine`):

* :class:`Migrations`: the pending migrations, planned when the step runs (under the migrators'
  lock, after the steps before it: an adoption records the baseline first);
* :class:`OneTransaction`: a migration in one transaction with its ledger row (all or nothing);
* :class:`Phased`: a large migration phase by phase, each phase recorded, resumable;
* :class:`Conversion`: an earlier build's ledger rows 0003-0016 recorded as ``0003_queue_stage``;
* :class:`Abort`: a phased migration in progress undone;

and the entry points :func:`apply`, :func:`install` and :func:`abort`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgflow_cli import sqlfiles
from pgflow_cli.errors import SchemaMissing, StateConflict
from pgflow_cli.installer import old_levels
from pgflow_cli.installer.catalog import SCHEMA_KINDS, compare, read_schema_facts
from pgflow_cli.installer.engine import Engine, LedgerEntry, Options, Outcome, Session, Step, run
from pgflow_cli.installer.events import PgmqInstalled, PhaseDone, PhaseStarted, ProgressFn, StepStarted
from pgflow_cli.installer.files import (
    QUERIES,
    Migration,
    Phase,
    TableLock,
    available_migrations,
    merge_locks,
    recheck_block,
)
from pgflow_cli.installer.ledger import LedgerRow, Plan, make_plan
from pgflow_cli.installer.pgmq_bootstrap import ensure_pgmq


@dataclass(kw_only=True)
class Applied(Outcome):
    """What applying one migration did (its conversion, for an earlier build's ledger).

    Attributes:
        migration: the migration.
    """

    migration: Migration


class Migrations:
    """The pending migrations up to ``target``, each the step its state and size call for.

    Planned when it runs: the ledger's conflicts refuse (exit 6), a database without PGMQ is
    refused (exit 3; a rendered script gets a note instead), ``--install-pgmq`` installs PGMQ
    first. In a dry run only the first pending migration runs.
    """

    def __init__(self, target: int | None = None) -> None:
        self.target = target

    def run(self, engine: Engine) -> list[Outcome]:
        conn, options = engine.conn, engine.options
        if options.install_pgmq and not engine.rendering:
            installed = ensure_pgmq(conn)
            if installed:
                engine.emit(PgmqInstalled(installed))
        plan = make_plan(conn)
        conflict = plan.refuse_reasons()
        if conflict:
            raise conflict
        if not plan.state.has_pgmq_meta and not engine.rendering:
            raise SchemaMissing(
                "PGMQ is not installed in this database",
                hint="install the pgmq extension (CREATE EXTENSION pgmq) or rerun with --install-pgmq "
                "to install the PGMQ SQL bundled with pgflow-cli")
        todo = [m for m in plan.pending if self.target is None or m.version <= self.target]
        if not todo:
            if engine.rendering:
                engine.note("nothing pending")
            return []
        if not plan.state.has_pgmq_meta:
            engine.note("PGMQ is not installed: psql stops at the first migration until it is (CREATE EXTENSION "
                        "pgmq), or use `pgflow migrate apply --install-pgmq`")
        if options.dry_run:
            todo = todo[:1]
        outcomes: list[Outcome] = []
        for migration in todo:
            outcomes += self.step_for(engine, plan, migration).run(engine)
            if engine.review is not None:
                break  # rendered for review only: the migrations after it need it committed
        return outcomes

    @staticmethod
    def step_for(engine: Engine, plan: Plan, migration: Migration) -> Step:
        """The step that applies ``migration`` here: the conversion of an earlier build's ledger,
        the phased path (resumed, forced, or a large table), or one transaction.

        Raises:
            StateConflict: rendering a migration in progress (its remaining phases commit one by one).
        """
        if plan.converts(migration):
            return Conversion(migration, plan)
        resume = next((s.recorded for s in plan.in_progress if s.version == migration.version), None)
        phased = migration.phased
        if engine.rendering:
            if resume is not None:
                raise StateConflict(
                    f"migration {migration.label} is in progress: its remaining phases run only phase by phase, "
                    "which cannot be printed as one script",
                    hint=f"resume it with `pgflow migrate apply`, or undo it with `pgflow migrate abort "
                    f"{migration.version}`")
            if phased and phased.has_online_phases and engine.options.online == "auto" and phased.large(engine.conn):
                engine.note(f"{migration.label}: `apply` would take the phased path here (large table); this script "
                            "is the one-transaction path, which holds its locks for the whole migration")
            return OneTransaction(migration)
        online = engine.options.online
        if phased and phased.has_online_phases and not engine.options.dry_run and (
                resume is not None or online == "always" or (online == "auto" and phased.large(engine.conn))):
            return Phased(migration, resume)
        return OneTransaction(migration)


def _current_recheck(session: Session, migration: Migration, text: str) -> None:
    """The current audit's blocking rules, once more, at the end of a ``--@preflight audit``
    migration's last transaction, under its locks, just before it commits.

    A released migration keeps the recheck it shipped with (its text is frozen), so rules added to
    ``sql/audit/findings.sql`` later (a flow queue without a table, tables PGMQ named with the
    database collation) would otherwise only be checked by the preflight, before any lock. Here
    they hold at the moment the upgrade commits: it never routes a task to a queue without a table.
    Nothing runs when ``text`` (what the transaction ran) holds the same rules already.
    """
    if migration.preflight_audit:
        block = recheck_block(migration.version)
        if block not in text:
            session.comment("the current audit's blocking rules, under the migration's locks")
            session.run(block)


class OneTransaction:
    """A migration in one transaction with its ledger row: all or nothing. A phased migration runs
    every phase but the ``notx`` ones (an optimisation the last phase does not need), its backfill
    in one statement over the whole table; the locks of every phase are taken first."""

    def __init__(self, migration: Migration) -> None:
        self.migration = migration

    def run(self, engine: Engine) -> list[Outcome]:
        migration = self.migration
        phases = migration.phases_for_single_transaction()
        skipped = [p.name for p in (migration.phased.apply_phases if migration.phased else ()) if p.mode == "notx"]

        def body(session: Session) -> None:
            for phase in phases:
                if migration.phased:
                    session.comment(f"phase {phase.name} ({phase.mode})")
                if phase.mode == "batch":
                    session.backfill(phase.name, phase.sql)
                else:
                    session.run(phase.sql)  # trusted, shipped SQL
            for name in skipped:
                session.comment(f"phase {name} (notx) is left out on this path, as `apply` leaves it out")
            _current_recheck(session, migration, migration.text)

        tally = engine.tally(migration.label)
        engine.transaction(tally, migration.locks_for([None, *(p.name for p in phases)]), body,
                           ledger=[LedgerEntry(migration)], announce=True,
                           heading=f"{migration.label} (sha256 {migration.checksum})")
        return [Applied(migration=migration, **engine.outcome(tally))]


class Phased:
    """A phased migration phase by phase: short locks, a backfill in ranges, a concurrent index
    build, and a last transaction that records it applied. Each phase is recorded in the ledger
    (``in_progress``, the phases done) as it commits, so a rerun resumes after the last one; until
    the last phase commits the database keeps its old behaviour."""

    def __init__(self, migration: Migration, resume: LedgerRow | None) -> None:
        self.migration = migration
        self.resume = resume

    def run(self, engine: Engine) -> list[Outcome]:
        migration = self.migration
        label = migration.label
        phased = migration.phased
        assert phased is not None
        done = list(self.resume.phases_done) if self.resume else []
        tally = engine.tally(label)
        engine.emit(StepStarted(label, 1, True, tuple(done)))
        for phase in phased.apply_phases:
            if phase.name in done:
                continue
            engine.emit(PhaseStarted(label, phase.name, phase.mode))
            t0 = time.monotonic()
            final = phase is phased.apply_phases[-1]
            progress = LedgerEntry(migration, "in_progress", (*done, phase.name), since=t0)
            if phase.mode == "notx":
                engine.concurrently(tally, phase.statements, f"phase {phase.name} of {label}")
                engine.transaction(tally, (), _nothing, ledger=[progress], final=False)
            elif phase.mode == "batch":
                engine.batches(tally, phase.name, phase.sql, locks=migration.locks_for([phase.name]),
                               pages=engine.options.batch_pages, bounded=True)
                engine.transaction(tally, (), _nothing, ledger=[progress], final=False)
            else:
                early, late = migration.phase_locks(phase.name)
                engine.transaction(tally, early, self._body(phase, late, final), final=final,
                                   ledger=[LedgerEntry(migration, since=t0) if final else progress])
            done.append(phase.name)
            engine.emit(PhaseDone(label, phase.name, int((time.monotonic() - t0) * 1000)))
        return [Applied(migration=migration, **engine.outcome(tally, online=True))]

    def _body(self, phase: Phase, late: tuple[TableLock, ...], final: bool) -> _PhaseBody:
        head, tail = self.migration.split_at_late_locks(phase)
        return _PhaseBody(self.migration, phase, head, tail, late, final)


@dataclass(frozen=True)
class _PhaseBody:
    """A ``tx`` phase of the phased path: its text up to the late locks, the late locks, the rest;
    the last phase ends with the current recheck."""

    migration: Migration
    phase: Phase
    head: str
    tail: str | None
    late: tuple[TableLock, ...]
    final: bool

    def __call__(self, session: Session) -> None:
        session.run(self.head)  # trusted, shipped SQL
        if self.tail is not None:
            session.late_locks(self.phase.name, self.late)
            session.run(self.tail)
        if self.final:
            _current_recheck(session, self.migration, self.phase.sql)


def _nothing(session: Session) -> None:
    """The body of a transaction that only records the ledger."""


_TRIGGER_TABLE = re.compile(r"^CREATE (?:OR REPLACE )?TRIGGER\s+\w+\s+(?:BEFORE|AFTER|INSTEAD\s+OF)\b.*?\bON\s+"
                            r"(?P<table>[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*)", re.MULTILINE | re.DOTALL)


_ALTERED_TABLE = re.compile(r"^ALTER TABLE\s+(?:IF EXISTS\s+)?(?P<table>[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*)", re.MULTILINE)
_REFERENCED_TABLE = re.compile(r"\bREFERENCES\s+(?P<table>[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*)")


def conversion_locks(functions: str, additions: str = "") -> tuple[TableLock, ...]:
    """The table locks a conversion takes first: ``ACCESS EXCLUSIVE`` (what ``ALTER TABLE ... ADD
    COLUMN`` takes) on every table the ``additions`` section alters, ``SHARE ROW EXCLUSIVE`` (what a
    new foreign key takes on the table it references) on every table a table it creates references,
    and ``SHARE ROW EXCLUSIVE`` (what ``CREATE TRIGGER`` takes) on every table the ``functions``
    section creates a trigger on; creating a table or replacing a function locks no other table."""
    return merge_locks([TableLock(m["table"], "ACCESS EXCLUSIVE") for m in _ALTERED_TABLE.finditer(additions)]
                       + [TableLock(m["table"], "SHARE ROW EXCLUSIVE") for m in _REFERENCED_TABLE.finditer(additions)]
                       + [TableLock(m["table"], "SHARE ROW EXCLUSIVE") for m in _TRIGGER_TABLE.finditer(functions)])


def conversion_sentence(plan: Plan) -> str:
    """What ``apply`` does with an earlier build's ledger rows 0003-0016 (:attr:`Plan.conversion`)."""
    first = plan.pending[0]
    return (f"the ledger records migrations 0003-0016 of pgflow-cli {old_levels.OLD_BUILD}: `pgflow migrate "
            f"apply` records them as {first.label} in one transaction, after a catalog comparison proves the schema "
            "is theirs (the stage's later columns and tables added, catalog only; functions and grants of the stage "
            "replaced; no table scanned or rewritten)")


class Conversion:
    """An earlier build's ledger rows 0003-0016 (all applied, known checksums) recorded as
    ``migration``, in one transaction under the table locks its function section needs.

    First the relational schema is compared with :data:`~pgflow_cli.installer.old_levels.LEVEL_16_SCHEMA`
    (what ``migration`` builds without its ``additions`` section); then its ``additions`` (the
    columns the stage gained after that build: catalog-only changes), ``functions`` and ``grants``
    sections run (``CREATE OR
    REPLACE`` keeps every existing grant), the functions of level 16 that the section did not
    create again are dropped, the per-file ledger of that build goes, and rows 0003-0016 become
    this migration's one row. Nothing is scanned. Rendered, it is for review only: the comparison
    is the tool's.

    Raises:
        StateConflict: the schema differs from level 16's (exit 6), with every difference in the
            detail; the transaction rolled back, nothing changed.
    """

    def __init__(self, migration: Migration, plan: Plan) -> None:
        self.migration = migration
        self.plan = plan

    def run(self, engine: Engine) -> list[Outcome]:
        migration = self.migration
        functions, grants = migration.section("functions"), migration.section("grants")
        additions = migration.section("additions")
        if engine.rendering:
            engine.review_only(
                "convert with `pgflow migrate apply`",
                conversion_sentence(self.plan) + ". It cannot be printed as a script psql runs as is: it first "
                "compares the catalog with the schema those migrations leave, which only the tool does (a script "
                "would rewrite the ledger of a database nobody checked); the text below is commented out, for "
                "review only. Convert with `pgflow migrate apply`; `--sql` prints the migrations after it")

        def body(session: Session) -> None:
            if session.executing:
                differences = compare(old_levels.LEVEL_16_SCHEMA, read_schema_facts(session.conn), SCHEMA_KINDS)
                if differences:
                    raise StateConflict(
                        f"the ledger records migrations {old_levels.FIRST:04d}-{old_levels.LAST:04d} of pgflow-cli "
                        f"{old_levels.OLD_BUILD}, but the schema differs from what they leave "
                        f"({len(differences)} difference(s)); nothing was changed",
                        hint="someone changed the pgflow tables by hand: undo those changes (the detail lists "
                        "them) and apply again, or rebuild the database",
                        detail=[d.describe() for d in differences])
            session.comment(f"the tool compares the catalog with the schema migrations {old_levels.FIRST:04d}-"
                            f"{old_levels.LAST:04d} of pgflow-cli {old_levels.OLD_BUILD} leave; then the stage's "
                            "functions:")
            session.comment("the columns and tables the stage has beyond level 16 (catalog only: nullable columns, "
                            "constant defaults, new empty tables):")
            session.run(additions)  # trusted, shipped SQL
            before = _function_rows(session)
            session.run(functions)  # trusted, shipped SQL
            after = _function_rows(session)  # before the grants, which rewrite every function's row
            session.comment("its grants:")
            session.run(grants)
            session.comment("the functions of level 16 it did not create again are dropped (the tool compares "
                            "where their catalog rows are stored before and after); the per-file ledger goes:")
            for signature in old_levels.LEVEL_16_FUNCTIONS:
                if signature in before and after.get(signature) == before[signature]:
                    # level 16 has it, the stage does not create it any more
                    session.run(sql.SQL(sqlfiles.statement(QUERIES, "drop_function")).format(
                        function=sql.SQL(signature)))
            session.run(sqlfiles.statement(QUERIES, "drop_file_ledger"))
            session.comment(f"ledger rows {old_levels.FIRST:04d}-{old_levels.LAST:04d} become one row of "
                            f"{migration.label}:")
            session.run(sqlfiles.statement(QUERIES, "ledger_replace_old_levels"),
                        {"first": old_levels.FIRST, "last": old_levels.LAST})

        tally = engine.tally(migration.label)
        engine.transaction(tally, conversion_locks(functions, additions), body, ledger=[LedgerEntry(migration)], announce=True,
                           heading=f"{migration.label}: the conversion of migrations {old_levels.FIRST:04d}-"
                           f"{old_levels.LAST:04d} of pgflow-cli {old_levels.OLD_BUILD}")
        return [Applied(migration=migration, **engine.outcome(tally))]


def _function_rows(session: Session) -> dict[str, str]:
    """pgflow's functions -> where their catalog row is stored (it moves when a statement replaces
    it); empty when rendering (the tool decides there)."""
    if not session.executing:
        return {}
    return {str(s): str(r) for s, r in session.fetch(sqlfiles.statement(QUERIES, "function_rows"))}


class Abort:
    """The ``abort`` phase of migration ``version``, in progress, in one transaction that forgets its
    ledger row.

    Raises:
        StateConflict: the migration is not in progress, or has no abort phase, or the ledger is one
            this tool cannot work on (an earlier build's migrations stopped part way: that build
            aborts them) (exit 6).
    """

    def __init__(self, version: int) -> None:
        self.version = version

    def run(self, engine: Engine) -> list[Outcome]:
        plan = make_plan(engine.conn)
        conflict = plan.refuse_reasons()
        if conflict is not None:
            raise conflict
        status = next((s for s in plan.statuses if s.version == self.version and s.state != "superseded"), None)
        if status is None or status.state != "in_progress":
            raise StateConflict(f"migration {self.version:04d} is not in progress; nothing to abort",
                                hint="`pgflow migrate status` shows every migration's state")
        migration = next(m for m in plan.pending if m.version == self.version)
        phased = migration.phased
        if phased is None or phased.abort is None:
            raise StateConflict(f"migration {migration.label} has no abort phase")
        undo = phased.abort

        def body(session: Session) -> None:
            session.run(undo.sql)  # trusted, shipped SQL
            session.run(sqlfiles.statement(QUERIES, "ledger_forget"), {"version": self.version})

        tally = engine.tally(f"abort {migration.label}")
        engine.transaction(tally, migration.locks_for([undo.name]), body, final=False)
        return [Applied(migration=migration, **engine.outcome(tally, announce=False))]


def apply(
    conn: psycopg.Connection,
    *,
    target: int | None = None,
    lock_timeout: float = 5.0,
    attempts: int = 5,
    progress: ProgressFn | None = None,
    lock_wait: float = 30.0,
    dry_run: bool = False,
    online: str = "auto",
    batch_pages: int = 64,
    batch_seconds: float = 0.2,
    install_pgmq: bool = False,
    before_commit: Callable[[psycopg.Connection, Migration], None] | None = None,
) -> list[Applied]:
    """Apply pending migrations in order, each atomically with its ledger row (:class:`Migrations`).

    Args:
        conn: an autocommit connection (its session takes the migrators' lock).
        target: apply up to and including this version (default: all).
        lock_timeout: seconds a transaction keeps trying for its locks (and a statement may wait
            for one) before it is rolled back and retried.
        attempts: tries per transaction on lock timeouts and deadlocks.
        progress: receives the run's events (:mod:`~pgflow_cli.installer.events`).
        lock_wait: seconds to wait for another migrator's advisory lock.
        dry_run: run the next pending migration in one transaction and roll it back.
        online: ``auto`` (phased when a migration's threshold table is large), ``always``
            or ``never`` (see :class:`~pgflow_cli.installer.files.PhasedMigration`).
        batch_pages: heap pages of the first backfill range (later ones adapt).
        batch_seconds: time each backfill range aims at, seconds: how long its rows stay locked.
        install_pgmq: install the bundled PGMQ SQL when the database has none, under the
            migrators' lock.
        before_commit: called as ``before_commit(conn, migration)`` inside each migration's last
            transaction just before it commits (tests look at its locks there).

    Returns:
        One :class:`Applied` per migration applied (or tried, in a dry run).

    Raises:
        StateConflict: ledger mismatch, unknown migrations, foreign pgflow schema or ledger, another
            migrator holding the migrators' lock past ``lock_wait`` (exit 6).
        ConnectionFailed: a hot standby or a read-only session (exit 3).
        SchemaMissing: PGMQ is not installed (exit 3).
        LockTimeout: a lock could not be taken within the retries (exit 4).
        psycopg.Error: PF005 when a migration's recheck under its locks finds blocking definitions
            (that migration was rolled back).
    """
    hook = None
    if before_commit is not None:
        by_label = {m.label: m for m in available_migrations()}

        def hook(conn: psycopg.Connection, label: str) -> None:
            before_commit(conn, by_label[label])

    options = Options(lock_timeout=lock_timeout, attempts=attempts, dry_run=dry_run, online=online,
                      batch_pages=batch_pages, batch_seconds=batch_seconds, lock_wait=lock_wait,
                      install_pgmq=install_pgmq, before_commit=hook)
    return [o for o in run(conn, [Migrations(target)], options, progress) if isinstance(o, Applied)]


def install(conn: psycopg.Connection, *, target: int | None = None, with_pgmq: bool = True,
            progress: ProgressFn | None = None) -> list[Applied]:
    """Install PGMQ (if asked and missing) and apply pending migrations: the sandbox/test entry point."""
    return apply(conn, target=target, progress=progress, install_pgmq=with_pgmq)


def abort(conn: psycopg.Connection, version: int, *, lock_timeout: float = 5.0,
          progress: ProgressFn | None = None) -> Migration:
    """Undo a phased migration that is in progress (:class:`Abort`), under the migrators' lock.

    Returns:
        The migration undone.

    Raises:
        StateConflict: see :class:`Abort`; another migrator holding the lock (exit 6).
        LockTimeout: its locks could not be taken within ``lock_timeout`` (exit 4).
    """
    [outcome] = run(conn, [Abort(version)], Options(lock_timeout=lock_timeout, attempts=1), progress)
    assert isinstance(outcome, Applied)
    return outcome.migration

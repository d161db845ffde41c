"""The one runner of the installer: every change it makes to a database is a step run here.

Migrations (in one transaction or phase by phase), the conversion of an earlier build's ledger,
the adoption of a schema a pgflow release installed and that adoption's online completion are
steps (:class:`Step`). A step describes its transactions through a :class:`Session`; everything
around them exists once, here:

* the migrators' advisory lock, held from a run's first step to its last (:func:`run`);
* one retry loop: a lock timeout or deadlock rolls the transaction back and runs it again, a
  bounded number of times (:meth:`Engine.retrying`), reported as :class:`~.events.Retrying`;
* one way to take table locks: a transaction's lock plan before any of its SQL, all or none
  (:func:`~.locks.take_locks`), and a phase's late locks in the middle of it
  (:meth:`Session.late_locks`), which roll the transaction back and run it again when they must
  not be waited for;
* one notice collection: the server notices of a step's committed attempts go into its outcome;
* one dry run: a step's last transaction runs, is measured and is rolled back;
* one ledger loop: the ledger rows a transaction records are written after its SQL, inside it;
* one backfill loop over a table's heap in page ranges (:meth:`Engine.batches`) and one runner of
  concurrent index builds (:meth:`Engine.concurrently`).

An engine executes the steps on the connection, or renders them as a psql script (:func:`render`,
``pgflow migrate apply --sql``): the same steps through the same sessions, the statements written
instead of sent. What only the tool can do (compare the catalog, recognise a release) cannot be
written as SQL; a step that needs it marks the script as for review only (:meth:`Engine.review_only`).
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg import ClientCursor, sql
from psycopg.rows import dict_row

from pgflow_cli import __version__, sqlfiles
from pgflow_cli.db import first_line, retry_on_lock, transaction
from pgflow_cli.errors import ConnectionFailed, StateConflict, UsageError
from pgflow_cli.installer.events import (
    BatchDone,
    Event,
    InvalidIndexDropped,
    LateLocksGivenBack,
    ProgressFn,
    Retrying,
    StepDone,
    StepStarted,
)
from pgflow_cli.installer.files import MAX_BATCH_PAGES, QUERIES, Migration, TableLock
from pgflow_cli.installer.locks import (
    LateLocksBusy,
    deadlock_timeout,
    lock_statement,
    migrator_lock,
    millis,
    take_late_locks,
    take_locks,
)

T = TypeVar("T")

Statement = str | sql.SQL | sql.Composed
"""What a session runs: shipped SQL text, or a statement composed with quoted identifiers."""

BATCH_ALL_PAGES = 4294967294
"""A page count that makes one call of a backfill cover the whole heap (block numbers are 32-bit)."""


@dataclass(frozen=True)
class Options:
    """How a run behaves (the options of ``pgflow migrate apply``).

    Attributes:
        lock_timeout: seconds a transaction may keep trying for its locks (and any statement may
            wait for one) before it is rolled back and retried.
        attempts: tries per transaction, on lock timeouts and deadlocks only.
        dry_run: each step's last transaction runs and is rolled back (phased paths are not taken).
        online: ``auto`` (phased when a migration's threshold table is large, an adoption online
            when its runtime tables are), ``always`` or ``never``.
        batch_pages: heap pages of a migration backfill's first range (later ranges adapt).
        batch_seconds: how long each backfill range aims to take, seconds (its rows stay locked that long).
        lock_wait: seconds to wait for another migrator's advisory lock.
        install_pgmq: install the bundled PGMQ SQL where the database has none.
        measure: read the rows touched and the locks held at the end of each step's last
            transaction (:attr:`Outcome.measured`; ``migrate apply`` reports them).
        before_commit: called as ``before_commit(conn, label)`` inside each step's last transaction
            just before it commits (or is rolled back in a dry run), after the measurement.
    """

    lock_timeout: float = 5.0
    attempts: int = 5
    dry_run: bool = False
    online: str = "auto"
    batch_pages: int = 64
    batch_seconds: float = 0.2
    lock_wait: float = 30.0
    install_pgmq: bool = False
    measure: bool = False
    before_commit: Callable[[psycopg.Connection, str], None] | None = None

    def __post_init__(self) -> None:
        if self.online not in ("auto", "always", "never"):
            raise ValueError(f"online must be auto, always or never, not {self.online!r}")


@dataclass(kw_only=True)
class Outcome:
    """What one step did (the subclasses add what is particular to a kind of step).

    Attributes:
        label: the step's label (``0003_queue_stage``, ``adoption of pgflow 0.8.1`` ...).
        duration_ms: wall time of the step, retries included, milliseconds.
        attempts: transactions tried, retries included.
        online: it ran phase by phase (a phased migration, an online adoption or completion).
        dry_run: it was rolled back.
        notices: server notices raised by its committed attempts.
        measured: ``rows_touched`` and ``locks_held`` of its last transaction (with
            :attr:`Options.measure`), else ``None``.
    """

    label: str
    duration_ms: int
    attempts: int
    online: bool = False
    dry_run: bool = False
    notices: list[str] = field(default_factory=list)
    measured: dict[str, Any] | None = None


class Step(Protocol):
    """One unit of work of a run: a migration, the conversion of a ledger, an adoption..."""

    def run(self, engine: Engine) -> list[Outcome]:
        """Do the work through ``engine`` (executed or rendered) and say what was done."""
        ...


@dataclass(frozen=True)
class LedgerEntry:
    """A row of ``pgflow.schema_migrations`` a transaction records, after its SQL, inside it.

    Attributes:
        migration: the migration recorded.
        state: ``applied`` or ``in_progress`` (a phased migration with phases left).
        phases_done: the phases committed so far (``in_progress`` only).
        since: ``time.monotonic()`` the recorded duration is counted from; ``None``: the
            transaction's start.
    """

    migration: Migration
    state: str = "applied"
    phases_done: tuple[str, ...] = ()
    since: float | None = None


@dataclass
class Tally:
    """The bookkeeping of one step while it runs (:meth:`Engine.tally`)."""

    label: str
    started: float
    notices_from: int
    tries: int = 0
    measured: dict[str, Any] | None = None


@dataclass
class Script:
    """A run rendered as text: a psql script, or text for review only.

    Attributes:
        text: the script (empty when there is nothing to do).
        notes: what the operator should know about it, one sentence each.
    """

    text: str
    notes: list[str] = field(default_factory=list)


class _Rollback(Exception):
    """A dry run's last transaction ends here: rolled back after it ran."""


class Engine:
    """Runs steps on a connection, or renders them (``rendering``); see the module docstring.

    Args:
        conn: an autocommit connection.
        options: how to run.
        progress: receives every event.
        rendering: write the statements as a script instead of sending them.
    """

    def __init__(self, conn: psycopg.Connection, options: Options | None = None,
                 progress: ProgressFn | None = None, *, rendering: bool = False) -> None:
        self.conn = conn
        self.options = options or Options()
        self.rendering = rendering
        self.notices: list[str] = []
        self.lines: list[str] = []
        self.notes: list[str] = []
        self.review: str | None = None
        self._progress = progress

    # events, notes and bookkeeping ------------------------------------------------------------------
    def emit(self, event: Event) -> None:
        if self._progress is not None:
            self._progress(event)

    def note(self, sentence: str) -> None:
        """Something the operator should know about a rendered script (stderr)."""
        self.notes.append(sentence)

    def review_only(self, title: str, why: str) -> None:
        """Mark the rendered script as text for review only: a step in it needs what only the tool
        does. ``title`` heads the script; ``why`` is the note explaining it."""
        if self.review is None:
            self.review = title
            self.note(why)

    def tally(self, label: str) -> Tally:
        """Start the bookkeeping of a step labelled ``label`` (its attempts, notices, duration)."""
        return Tally(label, time.monotonic(), len(self.notices))

    def outcome(self, tally: Tally, *, online: bool = False, announce: bool = True) -> dict[str, Any]:
        """The fields of :class:`Outcome` for the step ``tally`` counted, and its
        :class:`~.events.StepDone` (unless ``announce`` is false)."""
        duration = int((time.monotonic() - tally.started) * 1000)
        dry_run = self.options.dry_run and not online
        if announce:
            self.emit(StepDone(tally.label, duration, tally.tries, dry_run, online))
        return {"label": tally.label, "duration_ms": duration, "attempts": tally.tries, "online": online,
                "dry_run": dry_run, "notices": self.notices[tally.notices_from:], "measured": tally.measured}

    @contextmanager
    def collecting_notices(self) -> Iterator[None]:
        """Collect the server's notices into :attr:`notices` for a block (no-op when rendering)."""
        def collect(diag: psycopg.errors.Diagnostic) -> None:
            if diag.message_primary:
                self.notices.append(diag.message_primary)

        if self.rendering:
            yield
            return
        self.conn.add_notice_handler(collect)
        try:
            yield
        finally:
            self.conn.remove_notice_handler(collect)

    # the retry loop -----------------------------------------------------------------------------------
    def retrying(self, tally: Tally, action: Callable[[], T]) -> T:
        """``action`` (one whole transaction, or statements outside one) run again on a lock timeout
        or deadlock, up to :attr:`Options.attempts` tries, with backoff; each try counts in
        ``tally`` and the notices of a rolled-back try are dropped.

        Raises:
            LockTimeout: every try hit a lock timeout or deadlock (exit 4).
        """
        if self.rendering:
            tally.tries += 1
            return action()
        mark = len(self.notices)

        def counted() -> T:
            del self.notices[mark:]
            tally.tries += 1
            return action()

        def on_retry(number: int, exc: BaseException, delay: float) -> None:
            self.emit(Retrying(tally.label, number, first_line(exc), round(delay, 2)))

        return retry_on_lock(counted, attempts=self.options.attempts, on_retry=on_retry)

    # transactions ----------------------------------------------------------------------------------------
    def transaction(self, tally: Tally, locks: Sequence[TableLock], body: Callable[[Session], T], *,
                    ledger: Sequence[LedgerEntry] = (), final: bool = True, announce: bool = False,
                    heading: str | None = None) -> T:
        """One transaction of a step: ``locks`` first (all or none), then ``body``, then the
        ``ledger`` rows; retried as a whole (:meth:`retrying`).

        Args:
            tally: the step's bookkeeping.
            locks: the lock plan, merged and in lock order (late locks are the body's).
            body: the statements, given a :class:`Session`; what it returns is returned.
            ledger: rows recorded after the body, in the same transaction.
            final: the step's last transaction: measured, passed to :attr:`Options.before_commit`,
                and rolled back in a dry run.
            announce: emit :class:`~.events.StepStarted` at each attempt (a one-transaction step).
            heading: the line that introduces it in a rendered script.

        Returns:
            What ``body`` returned (also in a dry run, where it was rolled back).
        """
        if self.rendering:
            tally.tries += 1
            return self._render_transaction(locks, body, ledger, heading)

        def attempt() -> T:
            if announce:
                self.emit(StepStarted(tally.label, tally.tries, False))
            deadline = time.monotonic() + (self.options.lock_timeout or float("inf"))
            while True:
                session = Session(self, tally)
                started = time.monotonic()
                try:
                    with transaction(self.conn, lock_timeout=self.options.lock_timeout, statement_timeout=None):
                        take_locks(self.conn, locks, lock_timeout=self.options.lock_timeout)
                        value = body(session)
                        self._record(ledger, started)
                        if final and self._finish(tally, started):
                            raise _Rollback()
                    return value
                except _Rollback:
                    return value
                except LateLocksBusy as busy:
                    self.emit(LateLocksGivenBack(tally.label, session.phase or "", str(busy)))
                    if time.monotonic() >= deadline:
                        raise psycopg.errors.LockNotAvailable(
                            f"lock timeout: the late lock {busy} of phase {session.phase} was busy on every try "
                            f"for {self.options.lock_timeout:g} s") from None
                    time.sleep(random.uniform(0.001, 0.01))

        return self.retrying(tally, attempt)

    def _finish(self, tally: Tally, started: float) -> bool:
        """The end of a step's last transaction: measured, the caller's hook; True when it is to be
        rolled back (a dry run)."""
        if self.options.measure:
            with self.conn.cursor(row_factory=dict_row) as cur:
                changes = cur.execute(sqlfiles.statement(QUERIES, "transaction_changes")).fetchall()
                locks = cur.execute(sqlfiles.statement(QUERIES, "transaction_locks")).fetchall()
            held_ms = int((time.monotonic() - started) * 1000)
            tally.measured = {"rows_touched": changes, "locks_held": [{**lock, "held_ms": held_ms} for lock in locks]}
        if self.options.before_commit:
            self.options.before_commit(self.conn, tally.label)
        return self.options.dry_run

    def _record(self, ledger: Sequence[LedgerEntry], started: float) -> None:
        """The ledger loop: create the ledger if needed, then record each row (inside the transaction)."""
        if not ledger:
            return
        self.conn.execute(sqlfiles.statement(QUERIES, "ledger_bootstrap"))
        for entry in ledger:
            since = entry.since if entry.since is not None else started
            self.conn.execute(sqlfiles.statement(QUERIES, "ledger_record"),
                              _ledger_values(entry, int((time.monotonic() - since) * 1000)))

    def _render_transaction(self, locks: Sequence[TableLock], body: Callable[[Session], T],
                            ledger: Sequence[LedgerEntry], heading: str | None) -> T:
        """The transaction as psql runs it: the migrators' lock held to its end, the local lock
        timeout, the lock plan as LOCK TABLE statements, the body, the ledger rows."""
        out = self.lines
        if heading:
            out.append(f"-- ===== {heading} =====")
        out.append("BEGIN;")
        out.append(script_statement(sqlfiles.statement(QUERIES, "migrator_xact_lock")))
        session = Session(self, None)
        session.run(sqlfiles.statement(QUERIES, "local_lock_timeout"), {"value": millis(self.options.lock_timeout)})
        for lock in locks:
            session.run(lock_statement(lock, wait=True))
        value = body(session)
        if ledger:
            out.append("-- the ledger rows (what `apply` records in the same transaction)")
            session.run(sqlfiles.statement(QUERIES, "ledger_bootstrap"))
            for entry in ledger:
                session.run(sqlfiles.statement(QUERIES, "ledger_record"), _ledger_values(entry, 0))
        out.append("COMMIT;")
        out.append("")
        return value

    # backfills in ranges ---------------------------------------------------------------------------------
    def batches(self, tally: Tally, phase: str, statement: str, *, params: Mapping[str, Any] | None = None,
                locks: Sequence[TableLock] = (), pages: int, first_page: int = 0, bounded: bool,
                record: Callable[[Session, int], None] | None = None) -> None:
        """Run a backfill ``statement`` over a table's heap, one range of pages per transaction.

        The statement takes ``%(first_page)s`` and ``%(pages)s`` (and ``params``) and returns
        ``(rows updated, relation pages)``. Each range is sized so that it takes about
        :attr:`Options.batch_seconds` (its rows stay locked that long): the next range's page count
        is the last one's scaled by budget / elapsed, at most doubled or quartered per step,
        between 1 and :data:`~.files.MAX_BATCH_PAGES` pages.

        With ``bounded``, every lock wait of a range and the statement itself end within
        ``0.75 * deadlock_timeout``: a range updates rows one by one and may wait for a row a
        worker holds while another worker waits for a row it already updated. The transaction
        holds nothing when the range starts, so every session waiting for it checks for a
        deadlock ``deadlock_timeout`` after its wait began; ending within the bound gives every
        row back before any such check (or its own) runs. A range that runs out of time is rolled
        back and tried again with half the pages, for up to :attr:`Options.lock_timeout`.

        Args:
            tally: the step's bookkeeping.
            phase: the phase it belongs to (events).
            statement: the backfill statement (shipped SQL).
            params: its other parameters.
            locks: the lock plan each range's transaction takes first.
            pages: heap pages of the first range.
            first_page: where to start (a resumed backfill).
            bounded: bound each range by the deadlock timeout (rows the runtime may hold).
            record: called inside each range's transaction with the page the next one starts at
                (a resumable backfill records it).

        Raises:
            LockTimeout: a range could not get its locks or rows within the retries (exit 4).
        """
        if self.rendering:
            raise RuntimeError("a backfill in ranges runs only on the phased path, which is not rendered")
        bound = 0.75 * deadlock_timeout(self.conn) if bounded else None
        budget = self.options.batch_seconds if self.options.batch_seconds > 0 else 0.2
        pages = max(1, pages)
        while True:
            def one(first_page: int = first_page) -> tuple[int, int, int]:
                """One range: (rows updated, relation pages, pages done)."""
                nonlocal pages
                deadline = time.monotonic() + (self.options.lock_timeout or float("inf"))
                while True:
                    started = time.monotonic()
                    try:
                        with transaction(self.conn, lock_timeout=self.options.lock_timeout, statement_timeout=None):
                            take_locks(self.conn, locks, lock_timeout=self.options.lock_timeout)
                            if bound is not None:
                                self.conn.execute(sqlfiles.statement(QUERIES, "bounded_statement"),
                                                  {"value": millis(bound)})
                            row = self.conn.execute(statement, {**(params or {}), "first_page": first_page,
                                                                "pages": pages}).fetchone()
                            if record is not None:
                                record(Session(self, tally), first_page + pages)
                        return (int(row[0]), int(row[1]), pages) if row else (0, 0, pages)
                    except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled):
                        if bound is None or time.monotonic() - started < bound * 0.9:
                            raise  # not this bound: a lock timeout to retry, or somebody cancelled the statement
                        if time.monotonic() >= deadline:
                            raise psycopg.errors.LockNotAvailable(
                                f"backfill batch of {pages} page(s) from page {first_page}: rows stayed "
                                "locked by other sessions past lock_timeout") from None
                        pages = max(1, pages // 2)
                        time.sleep(random.uniform(0.005, 0.05))

            started = time.monotonic()
            updated, relation_pages, done = self.retrying(tally, one)
            elapsed = time.monotonic() - started
            self.emit(BatchDone(tally.label, phase, first_page, done, relation_pages, updated, int(elapsed * 1000)))
            first_page += done
            if first_page >= relation_pages:
                return
            wanted = done * budget / elapsed if elapsed > 0 else done * 2
            pages = max(1, min(MAX_BATCH_PAGES, int(max(done / 4, min(done * 2, wanted)))))

    # concurrent index builds ---------------------------------------------------------------------------
    def concurrently(self, tally: Tally, statements: Sequence[str], what: str) -> None:
        """Run ``statements`` outside any transaction, one by one (``CREATE INDEX CONCURRENTLY``),
        under a session ``lock_timeout``; retried on lock timeouts.

        A concurrent build that failed (a lock timeout while it waits for older transactions, a
        cancel, a duplicate) leaves an INVALID index that ``IF NOT EXISTS`` would then skip: every
        index the statements build is dropped (concurrently) first when it is invalid, and checked
        valid afterwards, so the caller records its work only with valid indexes.

        Args:
            tally: the step's bookkeeping.
            statements: each run on its own.
            what: what they are, in words, for the error (``phase index of 0003_queue_stage``).

        Raises:
            StateConflict: a statement finished but an index it builds is not valid (exit 6).
        """
        if self.rendering:
            raise RuntimeError("statements outside a transaction run only on a phased path, which is not rendered")
        indexes = [index for statement in statements for index in concurrent_indexes(statement)]

        def build() -> None:
            timeout = sqlfiles.statement(QUERIES, "session_lock_timeout")
            self.conn.execute(timeout, {"value": millis(self.options.lock_timeout)})
            try:
                for index in indexes:
                    if index_valid(self.conn, index) is False:
                        self.emit(InvalidIndexDropped(tally.label, index))
                        schema, name = index.split(".")
                        self.conn.execute(sql.SQL(sqlfiles.statement(QUERIES, "drop_index_concurrently")).format(
                            index=sql.Identifier(schema, name)))
                for statement in statements:  # one by one: several in one call would be one transaction
                    self.conn.execute(statement)  # trusted, shipped SQL
            finally:
                self.conn.execute(timeout, {"value": "0"})
            for index in indexes:
                if not index_valid(self.conn, index):
                    raise StateConflict(f"{what} finished but index {index} is not valid",
                                        hint="rerun `pgflow migrate apply`: it drops the invalid index and builds it again")

        self.retrying(tally, build)


class Session:
    """The statements of one transaction of a step, sent to the server or written into the script.

    A step's code is the same either way; where it must read the database to decide what to do
    (only the tool can), it asks :attr:`executing` and, when rendering, says in a comment what the
    tool does there (and marks the script for review only).
    """

    def __init__(self, engine: Engine, tally: Tally | None) -> None:
        self.engine = engine
        self.conn = engine.conn
        self.executing = not engine.rendering
        self.phase: str | None = None
        self._tally = tally

    def run(self, statement: Statement, params: Mapping[str, Any] | None = None) -> None:
        """Run one statement (or several in one text: shipped SQL), or write it into the script."""
        if self.executing:
            self.conn.execute(statement, params)  # trusted, shipped SQL
            return
        if params is not None:
            text = ClientCursor(self.conn).mogrify(statement, params)
        elif isinstance(statement, sql.Composable):
            text = statement.as_string(self.conn)
        else:
            text = statement
        self.engine.lines.append(script_statement(text))

    def fetch(self, statement: Statement, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """The rows of a read the step decides by: only when :attr:`executing`."""
        if not self.executing:
            raise RuntimeError("a rendered step cannot read inside its transaction; branch on Session.executing")
        return self.conn.execute(statement, params).fetchall()

    def comment(self, text: str) -> None:
        """A comment line in the script (nothing when executing)."""
        if not self.executing:
            self.engine.lines.extend(f"-- {line}" if line else "--" for line in text.splitlines())

    def late_locks(self, phase: str, locks: Sequence[TableLock]) -> None:
        """Take ``phase``'s late locks here, in the middle of the transaction
        (:func:`~.locks.take_late_locks`); when they must not be waited for, the engine rolls the
        transaction back and runs it again. A rendered transaction took every lock first."""
        self.phase = phase
        if self.executing:
            take_late_locks(self.conn, locks, lock_timeout=self.engine.options.lock_timeout)

    def backfill(self, phase: str, statement: str, params: Mapping[str, Any] | None = None) -> None:
        """A backfill statement (as :meth:`Engine.batches` takes) over the whole heap in one call, in
        this transaction: its rows stay locked to the end of it anyway."""
        values = {**(params or {}), "first_page": 0, "pages": BATCH_ALL_PAGES}
        if not self.executing:
            self.run(statement, values)
            return
        started = time.monotonic()
        row = self.conn.execute(statement, values).fetchone()
        rows, pages = (int(row[0]), int(row[1])) if row else (0, 0)
        label = self._tally.label if self._tally else ""
        self.engine.emit(BatchDone(label, phase, 0, pages, pages, rows, int((time.monotonic() - started) * 1000)))


def _ledger_values(entry: LedgerEntry, duration_ms: int) -> dict[str, Any]:
    migration = entry.migration
    return {"version": migration.version, "name": migration.name, "checksum": migration.checksum,
            "tool_version": __version__, "duration_ms": duration_ms, "state": entry.state,
            "phases_done": list(entry.phases_done)}


def script_statement(text: str) -> str:
    """One statement of a script, ended by exactly one semicolon (on its own line after a comment)."""
    body = text.rstrip().rstrip(";").rstrip()
    return body + ("\n;" if "--" in body.splitlines()[-1] else ";")


_CONCURRENT_INDEX = re.compile(
    r"\bCREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(?:IF\s+NOT\s+EXISTS\s+)?(?P<name>[a-z_][a-z0-9_]*)"
    r"\s+ON\s+(?:ONLY\s+)?(?P<schema>[a-z_][a-z0-9_]*)\.", re.IGNORECASE)


def concurrent_indexes(text: str) -> list[str]:
    """``schema.index`` of every ``CREATE INDEX CONCURRENTLY`` in ``text`` (the index lives in its table's schema)."""
    return [f"{m['schema'].lower()}.{m['name'].lower()}" for m in _CONCURRENT_INDEX.finditer(text)]


def index_valid(conn: psycopg.Connection, index: str) -> bool | None:
    """``pg_index.indisvalid`` of ``schema.index``; ``None`` when there is no such index."""
    row = conn.execute(sqlfiles.statement(QUERIES, "index_validity"), {"index": index}).fetchone()
    return None if row is None else bool(row[0])


def check_writable(conn: psycopg.Connection) -> None:
    """Refuse a server or session that cannot write, before anything is locked or changed.

    Raises:
        ConnectionFailed: a hot standby (recovery), or a session whose transactions are read-only
            (``default_transaction_read_only`` / ``transaction_read_only``, SQLSTATE 25006 later) (exit 3).
    """
    row = conn.execute(sqlfiles.statement(QUERIES, "writable")).fetchone()
    in_recovery, default_ro, ro = row if row else (False, "off", "off")
    if in_recovery:
        raise ConnectionFailed(
            "this server is a hot standby (in recovery): it cannot be migrated",
            hint="connect to the primary (--dsn); the standby receives the migration from it by replication")
    if "on" in (default_ro, ro):
        raise ConnectionFailed(
            "this session is read-only (default_transaction_read_only or transaction_read_only is on): it cannot migrate",
            hint="connect as a role (or to a database) without default_transaction_read_only = on, or set "
            "PGOPTIONS='-c default_transaction_read_only=off' for this command if the setting is yours")


def run(conn: psycopg.Connection, steps: Sequence[Step], options: Options | None = None,
        progress: ProgressFn | None = None) -> list[Outcome]:
    """Run ``steps`` in order under the migrators' advisory lock, collecting notices.

    Args:
        conn: an autocommit connection (its session takes the migrators' lock).
        steps: what to do; a step plans itself when it runs, so it sees what the steps before it did.
        options: how.
        progress: receives every event.

    Returns:
        The outcomes of the steps, in order.

    Raises:
        ConnectionFailed: a hot standby or a read-only session (exit 3).
        StateConflict: another migrator held its lock past :attr:`Options.lock_wait` (exit 6); or
            what a step refuses.
        LockTimeout: a transaction could not take its locks within the retries (exit 4).
    """
    engine = Engine(conn, options, progress)
    check_writable(conn)
    with migrator_lock(conn, engine.options.lock_wait, progress), engine.collecting_notices():
        return [outcome for step in steps for outcome in step.run(engine)]


def render(conn: psycopg.Connection, steps: Sequence[Step], options: Options | None = None) -> Script:
    """``steps`` as the psql script that does what :func:`run` does on its one-transaction paths
    (``pgflow migrate apply --sql``): each transaction a ``BEGIN ... COMMIT`` holding the migrators'
    lock, its lock plan first, every value written in. Nothing is changed; the database is read to
    plan. A step that needs the tool (a catalog comparison, a release recognised) makes the whole
    text one for review only, every line commented out, and the steps after it are not rendered
    (they need it committed).

    Raises:
        UsageError: ``online="always"``: the phased path cannot be printed as one script (exit 2).
        StateConflict: what a step refuses (a migration in progress, ...).
    """
    engine = Engine(conn, options, rendering=True)
    if engine.options.online == "always":
        raise UsageError(
            "the phased path cannot be printed as one script: it commits phase by phase, sizes its backfill "
            "batches while it runs and builds an index CONCURRENTLY outside any transaction",
            hint="--sql prints the one-transaction path (--online auto or never); run the phased path with "
            "`pgflow migrate apply --online always`")
    for step in steps:
        step.run(engine)
        if engine.review is not None:
            break
    if engine.review is not None:
        body = "\n".join(f"-- {line}" if line else "--" for line in "\n".join(engine.lines).rstrip("\n").splitlines())
        return Script(f"-- FOR REVIEW ONLY (not runnable as is): {engine.review}\n{body}\n", engine.notes)
    if not engine.lines:
        return Script("", engine.notes)
    header = [f"-- pgflow-cli {__version__}: `pgflow migrate apply` on its one-transaction path, as a psql script.",
              "-- Run it with: psql -v ON_ERROR_STOP=1 -f this-file.sql (each migration is one transaction).",
              "\\set ON_ERROR_STOP on", ""]
    return Script("\n".join(header + engine.lines), engine.notes)

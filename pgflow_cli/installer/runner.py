"""The runner: applies pending migrations (phases, locks, retries) and records them.

Every migration runs in one transaction with its ledger row, or phase by phase when it is
large (:class:`~pgflow_cli.installer.files.PhasedMigration`); a session advisory lock keeps two
migrators apart; lock timeouts and deadlocks roll back and retry a bounded number of times.
"""

from __future__ import annotations

import functools
import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from pgflow_cli import __version__, sqlfiles
from pgflow_cli.db import first_line, retry_on_lock, transaction
from pgflow_cli.errors import ConnectionFailed, Refused, SchemaMissing, StateConflict
from pgflow_cli.installer import old_levels
from pgflow_cli.installer.catalog import SCHEMA_KINDS, compare, read_schema_facts
from pgflow_cli.installer.files import (
    LOCK_CONFLICTS,
    LOCK_MODES,
    MAX_BATCH_PAGES,
    QUERIES,
    Migration,
    Phase,
    TableLock,
    available_migrations,
    merge_locks,
    pg_locks_mode,
)
from pgflow_cli.installer.ledger import LedgerRow, make_plan
from pgflow_cli.installer.pgmq_bootstrap import ensure_pgmq

ProgressFn = Callable[[str, dict[str, Any]], None]


QUEUE_EVERY = 8
"""Every this many tries, :func:`take_locks` queues for its first lock instead of trying it once."""


def take_locks(conn: psycopg.Connection, locks: Sequence[TableLock], *, lock_timeout: float) -> int:
    """Take ``locks`` at the start of the caller's transaction: all of them, or none.

    The runtime does not lock tables in one order (``start_flow`` reaches ``steps`` before
    ``step_tasks``, ``complete_task`` the other way round; docs/architecture.md "Locks a migration
    takes"), so no fixed order keeps a migration that holds one table and waits for the next out
    of a deadlock. What keeps a runtime call from ever being the victim, and the migration from
    being starved by a continuous stream of calls:

    * a lock is only ever waited for in the queue while the transaction holds nothing (that wait
      cannot be part of a deadlock), and not on every try: a queued migrator makes every call that
      reaches the table wait behind it, holding what it took before, which is exactly what blocks
      the migrator's next lock. So most tries take the first lock only if it is free at once
      (``NOWAIT``), and every :data:`QUEUE_EVERY`-th try queues for it (up to ``lock_timeout``),
      which drains a table that is never free;
    * every further lock is tried with ``NOWAIT``. When it is busy, one query asks who holds it:
      if a holder waits, directly or through others, for this transaction (a lock cycle), every
      lock is given back at once. Otherwise it is waited for in short slices, asking again after
      each, but only until the oldest lock waiter of the database is ``0.75 * deadlock_timeout``
      into its wait: a waiter checks for a deadlock once, ``deadlock_timeout`` after its wait began
      (``pg_locks.waitstart``), so the migration has given its locks back before anyone's check
      could find it in a cycle (and its own waits while holding end before its own check);
    * after giving back, a short random pause; the next try starts with the lock that stood in the
      way.

    Args:
        conn: a connection inside the transaction that needs the locks (nothing locked yet).
        locks: the merged lock plan (:meth:`Migration.locks_for`), in
            :data:`~pgflow_cli.installer.files.LOCK_ORDER`.
        lock_timeout: seconds, overall: how long to keep trying before giving up (0: no limit).

    Returns:
        How many times the whole set was tried (1 when nothing stood in the way).

    Raises:
        psycopg.errors.LockNotAvailable: not all locks within ``lock_timeout`` (the caller's
            bounded retry treats it as any lock timeout).
    """
    if not locks:
        return 0
    for lock in locks:
        if lock.mode not in LOCK_MODES:  # parse_locks checked; the mode is spliced as SQL text
            raise ValueError(f"unknown lock mode {lock.mode!r}")
    row = conn.execute(sqlfiles.statement(QUERIES, "deadlock_timeout_ms")).fetchone()
    check_after = (int(row[0]) if row and row[0] else 1000) / 1000
    deadline = time.monotonic() + (lock_timeout or float("inf"))
    local_timeout = sqlfiles.statement(QUERIES, "local_lock_timeout")
    first, tries = 0, 0
    while True:
        tries += 1
        order = [locks[first], *(lock for i, lock in enumerate(locks) if i != first)]
        try:
            with conn.transaction():  # a savepoint: rolling it back gives back every lock taken in it
                if tries % QUEUE_EVERY == 0:
                    conn.execute(local_timeout, {"value": _millis(max(0.001, deadline - time.monotonic()))})
                    conn.execute(_lock_statement(order[0], wait=True))
                elif not _try_lock(conn, order[0]):
                    raise _GiveBack()
                for lock in order[1:]:
                    if not _take_while_holding(conn, lock, check_after, deadline):
                        first = locks.index(lock)
                        raise _GiveBack()
            return tries
        except (_GiveBack, psycopg.errors.LockNotAvailable):
            if time.monotonic() >= deadline:
                raise psycopg.errors.LockNotAvailable(
                    f"lock timeout: not every lock of the plan within {lock_timeout:g} s") from None
            time.sleep(random.uniform(0.001, 0.01))
        finally:
            if not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
                conn.execute(local_timeout, {"value": _millis(lock_timeout)})


class _GiveBack(Exception):
    """The lock plan gives every lock back and tries again."""


class LateLocksBusy(Exception):
    """The late locks of a phase (:func:`take_late_locks`) must not be waited for now: the caller
    rolls the whole transaction back, giving every lock back, and runs it again."""


def take_late_locks(conn: psycopg.Connection, locks: Sequence[TableLock], *, lock_timeout: float) -> None:
    """Take a phase's late locks (``--@lock-at``) in the middle of its transaction, which holds its
    up-front locks and has run part of its SQL.

    The transaction holds locks, so nothing here is ever queued for: each lock is taken the way
    :func:`take_locks` takes a further lock (``NOWAIT``; when busy, the pg_locks cycle check and a
    wait in short slices only while the oldest lock waiter of the database is less than
    ``0.75 * deadlock_timeout`` into its wait). A session that began waiting for this transaction
    earlier (during the SQL that ran before) and holds one of these tables closes a cycle: the
    cycle query sees it and the lock is given up without waiting. Every other waiter's deadlock
    check comes ``deadlock_timeout`` after its own wait began, never before the oldest waiter's,
    which the wait stays under (docs/architecture.md "Late locks").

    Args:
        conn: the connection, inside the phase's transaction.
        locks: the merged late locks (:meth:`Migration.phase_locks`).
        lock_timeout: seconds; the transaction's ``lock_timeout`` is set back to it afterwards.

    Raises:
        LateLocksBusy: a lock is in a cycle or cannot be waited for now; the caller must roll the
            transaction back (giving every lock back) and run it again.
    """
    for lock in locks:
        if lock.mode not in LOCK_MODES:
            raise ValueError(f"unknown lock mode {lock.mode!r}")
    row = conn.execute(sqlfiles.statement(QUERIES, "deadlock_timeout_ms")).fetchone()
    check_after = (int(row[0]) if row and row[0] else 1000) / 1000
    deadline = time.monotonic() + check_after
    try:
        for lock in locks:
            if not _take_while_holding(conn, lock, check_after, deadline):
                raise LateLocksBusy(f"{lock.table} {lock.mode}")
    finally:
        if not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
            conn.execute(sqlfiles.statement(QUERIES, "local_lock_timeout"), {"value": _millis(lock_timeout)})


WAIT_SLICE = 0.05
"""Seconds :func:`take_locks` waits for a busy further lock before it asks again who holds it."""


def _lock_statement(lock: TableLock, *, wait: bool) -> sql.Composed:
    schema, table = lock.table.split(".")
    template = sqlfiles.statement(QUERIES, "lock_table" if wait else "lock_table_nowait")
    return sql.SQL(template).format(table=sql.Identifier(schema, table), mode=sql.SQL(lock.mode))


def _try_lock(conn: psycopg.Connection, lock: TableLock, wait: float = 0.0) -> bool:
    """Take ``lock`` if it is free (``wait`` 0) or within ``wait`` seconds; a failure rolls back
    only this inner savepoint, the locks taken before stay."""
    try:
        with conn.transaction():
            if wait:
                conn.execute(sqlfiles.statement(QUERIES, "local_lock_timeout"), {"value": _millis(wait)})
            conn.execute(_lock_statement(lock, wait=bool(wait)))
        return True
    except psycopg.errors.LockNotAvailable:
        return False


def _take_while_holding(conn: psycopg.Connection, lock: TableLock, check_after: float, deadline: float) -> bool:
    """One further lock of :func:`take_locks`, while the transaction holds the earlier ones.

    Returns:
        True when it is taken; False when it must not be waited for (a cycle, or no time left
        before the oldest waiter's deadlock check or the overall deadline).
    """
    conflicting = [pg_locks_mode(m) for m in LOCK_CONFLICTS[lock.mode]]
    if _try_lock(conn, lock):
        return True
    while True:
        row = conn.execute(sqlfiles.statement(QUERIES, "lock_contention"),
                           {"table": lock.table, "conflicting": conflicting}).fetchone()
        cycle, oldest_wait = (bool(row[0]), float(row[1])) if row else (True, check_after)
        budget = min(check_after * 0.75 - oldest_wait, deadline - time.monotonic())
        if cycle or budget < 0.005:
            return False
        if _try_lock(conn, lock, min(WAIT_SLICE, budget)):
            return True


def _millis(seconds: float | None) -> str:
    return f"{max(1, int(seconds * 1000))}ms" if seconds else "0"


@contextmanager
def locked_transaction(conn: psycopg.Connection, locks: Sequence[TableLock], *,
                       lock_timeout: float) -> Iterator[psycopg.Connection]:
    """One migration transaction: no statement timeout, ``lock_timeout`` per statement, and
    ``locks`` taken first (:func:`take_locks`). Every transaction the installer opens on pgflow
    tables goes through here (migrations, their phases, abort, adoption steps).

    Yields:
        The connection, inside the transaction, holding every lock of ``locks``.
    """
    with transaction(conn, lock_timeout=lock_timeout, statement_timeout=None):
        take_locks(conn, locks, lock_timeout=lock_timeout)
        yield conn


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
    install_pgmq: bool = False,
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
        install_pgmq: install the bundled PGMQ SQL when the database has none, under the
            migrator lock (event ``pgmq_installed`` with its version).

    Returns:
        One :class:`Applied` per migration applied (or tried, in a dry run).

    Raises:
        StateConflict: ledger mismatch, unknown migrations, foreign pgflow schema or ledger, another
            migrator holding the migrator lock past ``lock_wait`` (exit 6).
        ConnectionFailed: a hot standby or a read-only session (exit 3).
        SchemaMissing: PGMQ is not installed (exit 3).
        LockTimeout: a lock could not be taken within the retries (exit 4).
        Refused: the current audit's blocking rules found something under a migration's locks
            (exit 1; see :func:`_current_recheck`); that migration was rolled back.
    """
    if online not in ("auto", "always", "never"):
        raise ValueError(f"online must be auto, always or never, not {online!r}")
    emit = progress or (lambda event, data: None)
    check_writable(conn)
    _take_migrator_lock(conn, lock_wait, emit)
    try:
        if install_pgmq:
            installed = ensure_pgmq(conn)
            if installed:
                emit("pgmq_installed", {"version": installed})
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
        if dry_run:
            todo = todo[:1]
        results = []
        for migration in todo:
            if plan.converts(migration):
                results.append(_Runner(conn, migration, lock_timeout, attempts, emit, before_commit, batch_pages,
                                       batch_seconds).run_conversion(dry_run))
                continue
            runner = _Runner(conn, migration, lock_timeout, attempts, emit, _with_current_recheck(before_commit),
                             batch_pages, batch_seconds)
            phased = migration.phased
            resume = in_progress.get(migration.version)
            use_online = bool(phased and phased.has_online_phases and not dry_run and (
                resume is not None or online == "always" or (online == "auto" and phased.large(conn))))
            results.append(runner.run_online(resume) if use_online else runner.run_single(dry_run))
        return results
    finally:
        if not conn.closed:
            conn.execute(sqlfiles.statement(QUERIES, "migrator_unlock"))


def _with_current_recheck(
    before_commit: Callable[[psycopg.Connection, Migration], None] | None,
) -> Callable[[psycopg.Connection, Migration], None]:
    """``before_commit`` preceded by :func:`_current_recheck`."""
    def hook(conn: psycopg.Connection, migration: Migration) -> None:
        _current_recheck(conn, migration)
        if before_commit:
            before_commit(conn, migration)
    return hook


def _current_recheck(conn: psycopg.Connection, migration: Migration) -> None:
    """Run the CURRENT audit's blocking rules inside a ``--@preflight audit`` migration's final
    transaction, after its statements, under its locks, just before it commits.

    A released migration keeps the recheck it shipped with (its text is frozen), so rules added to
    ``sql/audit/findings.sql`` later (a flow queue without a table, tables PGMQ named with the
    database collation) would otherwise only be checked by the preflight, before any lock. Here
    they hold at the moment the upgrade commits: it never routes a task to a queue without a table.

    Raises:
        Refused: blocking findings (exit 1); the transaction rolls back with the caller's.
    """
    if not migration.preflight_audit:
        return
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(sqlfiles.statement("audit.sql", "findings")).fetchall()
    blocking = [r for r in rows if r["blocking"]]
    if blocking:
        raise Refused(
            f"{migration.label} refused: {len(blocking)} blocking finding(s) of the current audit under the "
            "migration's locks; this transaction was rolled back",
            hint="run `pgflow audit` for the report with fixes (docs/audit.md), then apply again",
            detail=[f"{r['check_id']} {r['object_name']}: {r['message']} [{', '.join(r['reasons'])}]" for r in blocking],
        )


class _DryRunRollback(Exception):
    pass


class _Runner:
    """Applies one migration: in one transaction, or phase by phase (online)."""

    def __init__(self, conn: psycopg.Connection, migration: Migration, lock_timeout: float, attempts: int,
                 emit: ProgressFn, before_commit: Callable[[psycopg.Connection, Migration], None] | None,
                 batch_pages: int, batch_seconds: float) -> None:
        self.conn = conn
        self.migration = migration
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

    def _backfill(self, phase: Phase, *, own_transactions: bool) -> None:
        """Run a ``batch`` phase over the whole heap, one range of pages per statement.

        Each range is sized so that its statement takes about ``batch_seconds`` (the rows it
        updates stay locked that long): the next range's page count is the last one's scaled by
        budget / elapsed, at most doubled or quartered per step, between 1 and 16,384 pages.
        On the phased path every range is its own transaction (retried on lock timeouts).
        """
        label = self.migration.label
        first_page, pages = 0, self.batch_pages
        row = self.conn.execute(sqlfiles.statement(QUERIES, "deadlock_timeout_ms")).fetchone()
        bound = 0.75 * (int(row[0]) if row and row[0] else 1000) / 1000
        while True:
            def one(first_page: int = first_page) -> tuple[int, int, int]:
                """One range: (rows updated, relation pages, pages done)."""
                nonlocal pages
                deadline = time.monotonic() + (self.lock_timeout or float("inf"))
                while True:
                    params = {"first_page": first_page, "pages": pages}
                    if not own_transactions:
                        row = self.conn.execute(phase.sql, params).fetchone()
                        break
                    started = time.monotonic()
                    try:
                        row = self._bounded_batch(phase, params, bound)
                        break
                    except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled):
                        if time.monotonic() - started < bound * 0.9:
                            raise  # not this bound: somebody cancelled the statement
                        if time.monotonic() >= deadline:
                            raise psycopg.errors.LockNotAvailable(
                                f"backfill batch of {pages} page(s) from page {first_page}: rows stayed "
                                "locked by other sessions past lock_timeout") from None
                        pages = max(1, pages // 2)
                        time.sleep(random.uniform(0.005, 0.05))
                return (int(row[0]), int(row[1]), pages) if row else (0, 0, pages)

            started = time.monotonic()
            updated, relation_pages, pages = self._retrying(one) if own_transactions else one()
            elapsed = time.monotonic() - started
            self.emit("batch", {"migration": label, "phase": phase.name, "first_page": first_page, "pages": pages,
                                "relation_pages": relation_pages, "rows": updated, "ms": int(elapsed * 1000)})
            first_page += pages
            if first_page >= relation_pages:
                return
            wanted = pages * self.batch_seconds / elapsed if elapsed > 0 else pages * 2
            pages = int(max(pages / 4, min(pages * 2, wanted)))
            pages = max(1, min(MAX_BATCH_PAGES, pages))

    def _bounded_batch(self, phase: Phase, params: dict[str, int], bound: float) -> Any:
        """One backfill range in its own transaction, every lock wait and the statement itself
        limited to ``bound`` seconds (``0.75 * deadlock_timeout``).

        The range updates rows one by one and may wait for a row a worker holds while another
        worker waits for a row the range already updated: a cycle in either order of the two
        waits. The transaction holds nothing when the range starts, so every session waiting
        for it began waiting after that and checks for a deadlock ``deadlock_timeout`` later;
        ending within ``bound`` gives every row back before any such check (or its own) runs.
        The caller retries a range that ran out of time with half the pages.

        Returns:
            The batch's row (rows updated, relation pages).

        Raises:
            psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled: out of time.
        """
        locks = self.migration.locks_for([phase.name])
        with locked_transaction(self.conn, locks, lock_timeout=self.lock_timeout):
            self.conn.execute(sqlfiles.statement(QUERIES, "bounded_statement"), {"value": _millis(bound)})
            return self.conn.execute(phase.sql, params).fetchone()

    # one transaction ------------------------------------------------------------------
    def run_single(self, dry_run: bool) -> Applied:
        """Every phase in one transaction with the ledger row: all or nothing."""
        phases = self.migration.phases_for_single_transaction()

        def work() -> None:
            for phase in phases:
                if phase.mode == "batch":
                    self._backfill(phase, own_transactions=False)
                else:
                    self.conn.execute(phase.sql)  # trusted, shipped SQL

        return self._in_one_transaction(self.migration.locks_for([None, *(p.name for p in phases)]), work, dry_run)

    def _in_one_transaction(self, locks: Sequence[TableLock], work: Callable[[], None], dry_run: bool,
                            **event: Any) -> Applied:
        """``work`` in one transaction under ``locks`` with the ledger row, retried on lock timeouts and
        deadlocks; rolled back instead of committed when ``dry_run``. ``event``: more fields of the
        ``start`` and ``done`` events."""
        label = self.migration.label
        started = time.monotonic()

        def attempt() -> None:
            self.notices.clear()
            self.emit("start", {"migration": label, "attempt": self.tries, "online": False, **event})
            t0 = time.monotonic()
            try:
                with locked_transaction(self.conn, locks, lock_timeout=self.lock_timeout):
                    work()
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
                           "online": False, **event})
        return Applied(self.migration, duration, self.tries, False, list(self.notices))

    # conversion of an earlier build's ledger ------------------------------------------------
    def run_conversion(self, dry_run: bool) -> Applied:
        """Record the old-level rows of the ledger (an earlier build's 0003-0016, all applied) as this
        migration, in one transaction under the table locks its function section needs.

        First the relational schema is compared with :data:`~pgflow_cli.installer.old_levels.LEVEL_16_SCHEMA`
        (what this migration builds); then the migration's ``functions`` and ``grants`` sections run
        (``CREATE OR REPLACE`` keeps every existing grant), the functions of level 16 that the
        section did not create again are dropped, the per-file ledger of that build goes, and rows
        0003-0016 become this migration's one row. Nothing is scanned.

        Raises:
            StateConflict: the schema differs from level 16's (exit 6), with every difference in the
                detail; the transaction rolled back, nothing changed.
        """
        functions, grants = self.migration.section("functions"), self.migration.section("grants")

        def work() -> None:
            differences = compare(old_levels.LEVEL_16_SCHEMA, read_schema_facts(self.conn), SCHEMA_KINDS)
            if differences:
                raise StateConflict(
                    f"the ledger records migrations {old_levels.FIRST:04d}-{old_levels.LAST:04d} of pgflow-cli "
                    f"{old_levels.OLD_BUILD}, but the schema differs from what they leave "
                    f"({len(differences)} difference(s)); nothing was changed",
                    hint="someone changed the pgflow tables by hand: undo those changes (the detail lists "
                    "them) and apply again, or rebuild the database",
                    detail=[d.describe() for d in differences])
            before = self._function_rows()
            self.conn.execute(functions)  # trusted, shipped SQL
            after = self._function_rows()  # before the grants, which rewrite every function's row
            self.conn.execute(grants)
            for signature in old_levels.LEVEL_16_FUNCTIONS:
                if signature in before and after.get(signature) == before[signature]:
                    # level 16 has it, the stage does not create it any more
                    self.conn.execute(sql.SQL(sqlfiles.statement(QUERIES, "drop_function")).format(
                        function=sql.SQL(signature)))
            self.conn.execute(sqlfiles.statement(QUERIES, "drop_file_ledger"))
            self.conn.execute(sqlfiles.statement(QUERIES, "ledger_replace_old_levels"),
                              {"first": old_levels.FIRST, "last": old_levels.LAST})

        return self._in_one_transaction(conversion_locks(functions), work, dry_run, conversion=True)

    def _function_rows(self) -> dict[str, str]:
        """pgflow's functions -> where their catalog row is stored (it moves when a statement replaces it)."""
        return dict(self.conn.execute(sqlfiles.statement(QUERIES, "function_rows")).fetchall())

    # phase by phase ---------------------------------------------------------------------
    def run_online(self, resume: LedgerRow | None) -> Applied:
        """Each phase in its own transaction(s); the ledger tracks progress so a rerun resumes."""
        label = self.migration.label
        phased = self.migration.phased
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
                self._retrying(functools.partial(self._notx, phase))
                with transaction(self.conn, lock_timeout=self.lock_timeout, statement_timeout=None):
                    self._record(state="in_progress", phases_done=done + [phase.name],
                                 duration_ms=int((time.monotonic() - t0) * 1000))
            elif phase.mode == "batch":
                self._backfill(phase, own_transactions=True)
                with transaction(self.conn, lock_timeout=self.lock_timeout, statement_timeout=None):
                    self._record(state="in_progress", phases_done=done + [phase.name],
                                 duration_ms=int((time.monotonic() - t0) * 1000))
            else:
                def run_tx(phase: Phase = phase, final: bool = final, t0: float = t0) -> None:
                    early, late = self.migration.phase_locks(phase.name)
                    head, tail = self.migration.split_at_late_locks(phase)
                    deadline = time.monotonic() + (self.lock_timeout or float("inf"))
                    while True:
                        try:
                            with locked_transaction(self.conn, early, lock_timeout=self.lock_timeout):
                                self.conn.execute(head)  # trusted, shipped SQL
                                if tail is not None:
                                    take_late_locks(self.conn, late, lock_timeout=self.lock_timeout)
                                    self.conn.execute(tail)
                                self._record(state="applied" if final else "in_progress",
                                             phases_done=[] if final else done + [phase.name],
                                             duration_ms=int((time.monotonic() - t0) * 1000))
                                if final and self.before_commit:
                                    self.before_commit(self.conn, self.migration)
                            return
                        except LateLocksBusy as busy:
                            self.emit("late_locks_busy", {"migration": label, "phase": phase.name, "lock": str(busy)})
                            if time.monotonic() >= deadline:
                                raise psycopg.errors.LockNotAvailable(
                                    f"lock timeout: the late lock {busy} of phase {phase.name} was busy on every "
                                    f"try for {self.lock_timeout:g} s") from None
                            time.sleep(random.uniform(0.001, 0.01))

                self._retrying(run_tx)
            done.append(phase.name)
            self.emit("phase_done", {"migration": label, "phase": phase.name,
                                     "duration_ms": int((time.monotonic() - t0) * 1000)})
        duration = int((time.monotonic() - started) * 1000)
        self.emit("done", {"migration": label, "duration_ms": duration, "attempts": self.tries, "dry_run": False,
                           "online": True})
        return Applied(self.migration, duration, self.tries, True, list(self.notices))

    def _notx(self, phase: Phase) -> None:
        """Run a phase's statements outside a transaction, one by one (``CREATE INDEX CONCURRENTLY``),
        under a session ``lock_timeout``. A concurrent build that failed (a lock timeout while it waits for older
        transactions, a cancel, a duplicate) leaves an INVALID index that ``IF NOT EXISTS`` would
        then skip: every index the statement builds is dropped (concurrently) first when it is
        invalid, and checked valid afterwards, so the phase is recorded only with a valid index.

        Raises:
            StateConflict: the statement finished but an index it builds is not valid (exit 6).
        """
        timeout = sqlfiles.statement(QUERIES, "session_lock_timeout")
        self.conn.execute(timeout, {"value": f"{int(self.lock_timeout * 1000)}ms"})
        try:
            for index in concurrent_indexes(phase.sql):
                if index_valid(self.conn, index) is False:
                    self.emit("invalid_index", {"migration": self.migration.label, "index": index, "action": "drop"})
                    schema, name = index.split(".")
                    self.conn.execute(sql.SQL(sqlfiles.statement(QUERIES, "drop_index_concurrently")).format(
                        index=sql.Identifier(schema, name)))
            for statement in phase.statements:  # one by one: several in one call would be one transaction
                self.conn.execute(statement)  # trusted, shipped SQL
        finally:
            self.conn.execute(timeout, {"value": "0"})
        for index in concurrent_indexes(phase.sql):
            if not index_valid(self.conn, index):
                raise StateConflict(
                    f"phase {phase.name} of {self.migration.label} finished but index {index} is not valid",
                    hint="rerun `pgflow migrate apply`: it drops the invalid index and builds it again")


_TRIGGER_TABLE = re.compile(r"^CREATE (?:OR REPLACE )?TRIGGER\s+\w+\s+(?:BEFORE|AFTER|INSTEAD\s+OF)\b.*?\bON\s+"
                            r"(?P<table>[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*)", re.MULTILINE | re.DOTALL)


def conversion_locks(functions: str) -> tuple[TableLock, ...]:
    """The table locks a conversion takes first: ``SHARE ROW EXCLUSIVE`` (what ``CREATE TRIGGER``
    takes) on every table the ``functions`` section creates a trigger on; replacing a function
    locks no table."""
    return merge_locks([TableLock(m["table"], "SHARE ROW EXCLUSIVE") for m in _TRIGGER_TABLE.finditer(functions)])


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


def abort(conn: psycopg.Connection, version: int, *, lock_timeout: float = 5.0,
          progress: ProgressFn | None = None) -> Migration:
    """Undo a phased migration that is in progress (its ``abort`` phase), in one transaction.

    Raises:
        StateConflict: the migration is not in progress, or has no abort phase, or the ledger is one
            this tool cannot work on (an earlier build's migrations stopped part way: that build
            aborts them) (exit 6).
    """
    emit = progress or (lambda event, data: None)
    check_writable(conn)
    _take_migrator_lock(conn, 30.0, emit)
    try:
        plan = make_plan(conn)
        conflict = plan.refuse_reasons()
        if conflict is not None:
            raise conflict
        status = next((s for s in plan.statuses if s.version == version and s.state != "superseded"), None)
        if status is None or status.state != "in_progress":
            raise StateConflict(f"migration {version:04d} is not in progress; nothing to abort",
                                hint="`pgflow migrate status` shows every migration's state")
        migration = next(m for m in available_migrations() if m.version == version)
        phased = migration.phased
        if phased is None or phased.abort is None:
            raise StateConflict(f"migration {migration.label} has no abort phase")
        with locked_transaction(conn, migration.locks_for([phased.abort.name]), lock_timeout=lock_timeout):
            conn.execute(phased.abort.sql)  # trusted, shipped SQL
            conn.execute(sqlfiles.statement(QUERIES, "ledger_forget"), {"version": version})
        return migration
    finally:
        if not conn.closed:
            conn.execute(sqlfiles.statement(QUERIES, "migrator_unlock"))


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


def _describe_holders(holders: list[dict[str, Any]]) -> list[str]:
    return [f"pid {h['pid']} ({h['application_name'] or 'no application name'}, user {h['user_name']}), "
            f"since {h['since']} ({h['connected_seconds']} s), {h['state']}" for h in holders]


@contextmanager
def migrator_lock(conn: psycopg.Connection, wait: float = 30.0, progress: ProgressFn | None = None) -> Iterator[None]:
    """Hold the session advisory lock of migrators for a block (what :func:`apply` takes itself);
    the adoption of an upstream schema runs under it.

    Raises:
        StateConflict: another migrator held it for ``wait`` seconds (exit 6), naming the holder.
    """
    _take_migrator_lock(conn, wait, progress or (lambda event, data: None))
    try:
        yield
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
            emit("lock_wait", {"holders": holders, "described": _describe_holders(holders), "wait_seconds": wait})
            announced = True
        if time.monotonic() >= deadline:
            who = _describe_holders(holders)
            raise StateConflict(
                f"another migrator holds the lock: {who[0] if who else 'a session that just ended'}",
                hint=f"waited {wait:g} s; let it finish (`pgflow migrate status` shows its progress), then run the "
                "command again; two migrators never run at once",
                detail=who[1:],
            )
        time.sleep(0.5)


def install(conn: psycopg.Connection, *, target: int | None = None, with_pgmq: bool = True,
            progress: ProgressFn | None = None) -> list[Applied]:
    """Install PGMQ (if asked and missing) and apply pending migrations: the sandbox/test entry point."""
    return apply(conn, target=target, progress=progress, install_pgmq=with_pgmq)

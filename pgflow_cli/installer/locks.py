"""Table locks of the installer's transactions, and the migrators' advisory lock.

:func:`take_locks` takes a transaction's lock plan before any of its SQL, all or none;
:func:`take_late_locks` takes a phase's late locks in the middle of its transaction. Both wait
only in ways no runtime call can become a deadlock victim of (docs/architecture.md "Locks a
migration takes"). :func:`hold_migrator_lock` keeps two migrators apart for a whole run.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from pgflow_cli import sqlfiles
from pgflow_cli.errors import StateConflict
from pgflow_cli.installer.events import MigratorLockWait, ProgressFn
from pgflow_cli.installer.files import LOCK_CONFLICTS, LOCK_MODES, QUERIES, TableLock, pg_locks_mode

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
    check_after = deadlock_timeout(conn)
    deadline = time.monotonic() + (lock_timeout or float("inf"))
    local_timeout = sqlfiles.statement(QUERIES, "local_lock_timeout")
    first, tries = 0, 0
    while True:
        tries += 1
        order = [locks[first], *(lock for i, lock in enumerate(locks) if i != first)]
        try:
            with conn.transaction():  # a savepoint: rolling it back gives back every lock taken in it
                if tries % QUEUE_EVERY == 0:
                    conn.execute(local_timeout, {"value": millis(max(0.001, deadline - time.monotonic()))})
                    conn.execute(lock_statement(order[0], wait=True))
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
                conn.execute(local_timeout, {"value": millis(lock_timeout)})


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
    check_after = deadlock_timeout(conn)
    deadline = time.monotonic() + check_after
    try:
        for lock in locks:
            if not _take_while_holding(conn, lock, check_after, deadline):
                raise LateLocksBusy(f"{lock.table} {lock.mode}")
    finally:
        if not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
            conn.execute(sqlfiles.statement(QUERIES, "local_lock_timeout"), {"value": millis(lock_timeout)})


WAIT_SLICE = 0.05
"""Seconds :func:`take_locks` waits for a busy further lock before it asks again who holds it."""


def lock_statement(lock: TableLock, *, wait: bool) -> sql.Composed:
    """``LOCK TABLE schema.table IN mode MODE`` (with ``NOWAIT`` unless ``wait``), identifiers quoted."""
    schema, table = lock.table.split(".")
    template = sqlfiles.statement(QUERIES, "lock_table" if wait else "lock_table_nowait")
    return sql.SQL(template).format(table=sql.Identifier(schema, table), mode=sql.SQL(lock.mode))


def _try_lock(conn: psycopg.Connection, lock: TableLock, wait: float = 0.0) -> bool:
    """Take ``lock`` if it is free (``wait`` 0) or within ``wait`` seconds; a failure rolls back
    only this inner savepoint, the locks taken before stay."""
    try:
        with conn.transaction():
            if wait:
                conn.execute(sqlfiles.statement(QUERIES, "local_lock_timeout"), {"value": millis(wait)})
            conn.execute(lock_statement(lock, wait=bool(wait)))
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


def deadlock_timeout(conn: psycopg.Connection) -> float:
    """The server's ``deadlock_timeout`` for this session, seconds: a lock waiter checks for a deadlock
    this long after its wait began."""
    row = conn.execute(sqlfiles.statement(QUERIES, "deadlock_timeout_ms")).fetchone()
    return (int(row[0]) if row and row[0] else 1000) / 1000


def millis(seconds: float | None) -> str:
    """Seconds as a timeout setting: ``0`` (no limit) for ``None``/0, at least ``1ms`` otherwise."""
    return f"{max(1, int(seconds * 1000))}ms" if seconds else "0"


def _describe_holders(holders: list[dict[str, Any]]) -> list[str]:
    return [f"pid {h['pid']} ({h['application_name'] or 'no application name'}, user {h['user_name']}), "
            f"since {h['since']} ({h['connected_seconds']} s), {h['state']}" for h in holders]


@contextmanager
def migrator_lock(conn: psycopg.Connection, wait: float = 30.0, progress: ProgressFn | None = None) -> Iterator[None]:
    """Hold the migrators' session advisory lock for a block: every run of the engine holds it from
    its first step to its last, so two migrators never interleave (and a session may nest it: the
    lock counts). It is taken before anything is read, so what a run plans is what it applies.

    Args:
        conn: an autocommit connection (the lock belongs to its session).
        wait: seconds to wait for another migrator before giving up.
        progress: receives :class:`~pgflow_cli.installer.events.MigratorLockWait` once when it waits.

    Raises:
        StateConflict: another migrator held it for ``wait`` seconds (exit 6), naming the holder.
    """
    deadline = time.monotonic() + wait
    announced = False
    while True:
        row = conn.execute(sqlfiles.statement(QUERIES, "migrator_try_lock")).fetchone()
        if row and row[0]:
            break
        with conn.cursor(row_factory=dict_row) as cur:
            who = _describe_holders(cur.execute(sqlfiles.statement(QUERIES, "migrator_lock_holder")).fetchall())
        if not announced and progress is not None:
            progress(MigratorLockWait(tuple(who), wait))
        announced = True
        if time.monotonic() >= deadline:
            raise StateConflict(
                f"another migrator holds the lock: {who[0] if who else 'a session that just ended'}",
                hint=f"waited {wait:g} s; let it finish (`pgflow migrate status` shows its progress), then run the "
                "command again; two migrators never run at once",
                detail=who[1:],
            )
        time.sleep(0.5)
    try:
        yield
    finally:
        if not conn.closed:
            conn.execute(sqlfiles.statement(QUERIES, "migrator_unlock"))

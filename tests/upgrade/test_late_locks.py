"""Late locks (``--@lock-at``): 0003's first phase rechecks the task table without locking it.

The recheck of migration 0003's ``prepare`` phase scans every task row (1-2 s on a million). Its
lock plan (sql/migrations/0003/locks.sql) freezes the definitions (``SHARE ROW EXCLUSIVE`` on
flows and steps) up front and takes the task table exclusively only at the statement of 0003's
text that locks it, after the recheck (installer.runner.take_late_locks). These tests hold the
recheck in the middle (a session holds ``pgmq.meta``, which the recheck reads and workers do
not) and look at what the migration holds and who can go on, through pg_locks, never by time.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_cli import installer
from pgflow_cli.installer.files import TableLock, parse_locks
from pgflow_cli.installer.runner import LateLocksBusy, take_late_locks
from tests.support.levels import versions_after
from tests.worker.helpers import wait_until

HELD = """
SELECT c.relname::text, l.mode, l.granted
FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation
WHERE l.pid = %s AND l.locktype = 'relation' AND c.relnamespace IN ('pgflow'::regnamespace, 'pgmq'::regnamespace)
"""


def _wait_for(observer: psycopg.Connection, pid: int, predicate, what: str) -> set:
    """Polls a session's relation locks until ``predicate(locks)`` holds; returns them."""
    found: list[set] = []

    def check() -> bool:
        found[:] = [{tuple(r) for r in observer.execute(HELD, (pid,)).fetchall()}]
        return bool(predicate(found[0]))

    wait_until(check, f"{what} (pid {pid})", timeout=120)
    return found[0]


class _HeldRecheck:
    """``installer.apply`` (phased) started in ``pool`` while a session holds ``pgmq.meta``, which
    0003's prepare recheck reads: returns once the recheck waits for it, definitions frozen."""

    def __init__(self, database, pool: ThreadPoolExecutor) -> None:
        migrator = database.connect()
        self.observer = database.connect()
        self.blocker = psycopg.connect(database.conninfo)
        self.events: list[tuple[str, dict]] = []
        self.blocker.execute("LOCK TABLE pgmq.meta IN ACCESS EXCLUSIVE MODE")
        self.applying = pool.submit(installer.apply, migrator, online="always", lock_timeout=60,
                                    progress=lambda event, data: self.events.append((event, data)))
        try:
            self.locks = _wait_for(self.observer, migrator.info.backend_pid,
                                   lambda held: ("meta", "AccessShareLock", False) in held
                                   and ("flows", "ShareRowExclusiveLock", True) in held,
                                   "the recheck to wait for pgmq.meta")
        except BaseException:
            self.release()  # never leave the migration waiting behind a failed test
            raise

    def release(self) -> None:
        self.blocker.rollback()

    def close(self) -> None:
        self.blocker.close()


def test_prepare_rechecks_while_workers_and_producers_go_on(pre_upgrade):
    database, _state = pre_upgrade
    worker = database.connect()
    with ThreadPoolExecutor(1) as pool:
        held = _HeldRecheck(database, pool)
        try:
            locks = held.locks
            assert ("steps", "ShareRowExclusiveLock", True) in locks
            assert not [lock for lock in locks if lock[0] in ("step_tasks", "worker_functions")], sorted(locks)
            # meanwhile a worker reads and row-locks task rows and a producer starts a run, at once
            worker.execute("SET lock_timeout = '5s'")
            with worker.transaction():
                rows = worker.execute("SELECT run_id FROM pgflow.step_tasks ORDER BY run_id LIMIT 3 FOR UPDATE").fetchall()
            assert rows
            run = worker.execute("SELECT run_id FROM pgflow.start_flow('orderFlow', %s)", (Jsonb({"n": 1}),)).fetchone()
            assert run
        finally:
            held.release()
        results = held.applying.result(timeout=300)
    assert [r.migration.version for r in results] == [3, *versions_after(3)]
    assert results[0].online
    # the run started during prepare got its queue like every other task (the fill trigger)
    missing = worker.execute("SELECT count(*) FROM pgflow.step_tasks WHERE queue_name IS NULL").fetchone()[0]
    assert missing == 0
    held.close()


def test_the_late_locks_give_way_to_a_holder_that_waits_for_the_migration(pre_upgrade):
    """A session holding the task table that waits for a definitions lock the migration holds (a
    drop_flow-like writer): the late lock is a cycle; the transaction gives everything back and
    runs again once the other session is through. Nobody gets 40P01."""
    database, _state = pre_upgrade
    other = psycopg.connect(database.conninfo)
    with ThreadPoolExecutor(2) as pool:
        held = _HeldRecheck(database, pool)
        observer, events = held.observer, held.events
        try:
            # the other session holds the task table and then writes a step definition: it waits for
            # the migration's SHARE ROW EXCLUSIVE on steps
            other.execute("SELECT 1 FROM pgflow.step_tasks LIMIT 1 FOR UPDATE")
            other_pid = other.info.backend_pid
            writing = pool.submit(other.execute, "UPDATE pgflow.steps SET step_slug = step_slug WHERE false")
            _wait_for(observer, other_pid, lambda held: ("steps", "RowExclusiveLock", False) in held,
                      "the writer to wait for the migration")
            held.release()  # the recheck ends; the late lock meets the writer holding step_tasks
            writing.result(timeout=120)  # the migration gave way: the writer got its lock
            gave_way = ("late_locks_busy", {"migration": "0003_queue_stage", "phase": "prepare",
                                            "lock": "pgflow.step_tasks ACCESS EXCLUSIVE"})
            wait_until(lambda: gave_way in events, "the migration to report that it gave way", timeout=120)
            other.commit()
        finally:
            held.release()
            other.rollback()
        results = held.applying.result(timeout=300)
    assert [r.migration.version for r in results] == [3, *versions_after(3)]
    assert not [data for event, data in events if event == "retry"], events
    held.close()
    other.close()


def test_late_lock_lines_are_parsed_and_checked():
    text = ("--@phase prepare\n--@lock pgflow.flows SHARE ROW EXCLUSIVE\n--@lock-at LOCK TABLE pgflow.step_tasks IN "
            "ACCESS EXCLUSIVE MODE;\n--@lock pgflow.step_tasks ACCESS EXCLUSIVE\n--@phase main\n"
            "--@lock pgflow.steps ACCESS EXCLUSIVE\n")
    assert parse_locks(text, "x") == {
        "prepare": (TableLock("pgflow.flows", "SHARE ROW EXCLUSIVE"),
                    TableLock("pgflow.step_tasks", "ACCESS EXCLUSIVE", "LOCK TABLE pgflow.step_tasks IN ACCESS "
                              "EXCLUSIVE MODE;")),
        "main": (TableLock("pgflow.steps", "ACCESS EXCLUSIVE"),)}
    with pytest.raises(RuntimeError, match="once per phase"):
        parse_locks("--@lock-at LOCK TABLE x;\n--@lock pgflow.steps SHARE\n", "x")
    with pytest.raises(RuntimeError, match="once per phase"):
        parse_locks("--@phase a\n--@lock-at A\n--@lock-at B\n", "x")


def test_every_late_lock_statement_is_found_once_in_its_phase():
    for migration in installer.available_migrations():
        phased = migration.phased
        for phase in phased.apply_phases if phased else ():
            early, late = migration.phase_locks(phase.name)
            head, tail = migration.split_at_late_locks(phase)
            assert (tail is None) == (not late), (migration.label, phase.name)
            if tail is not None:
                assert head + tail == phase.sql
                assert tail.startswith(late[0].at if late[0].at else "LOCK TABLE")
    prepare = installer.available_migrations()[2]
    assert prepare.version == 3
    early, late = prepare.phase_locks("prepare")
    assert [lock.table for lock in early] == ["pgflow.flows", "pgflow.steps"]
    assert [(lock.table, lock.mode) for lock in late] == [("pgflow.step_tasks", "ACCESS EXCLUSIVE")]


def test_late_locks_never_queue_while_holding(baseline_db):
    """A late lock held by an idle session (no cycle, nobody waiting long): waited for in slices,
    then given up with LateLocksBusy once the oldest waiter nears its deadlock check; the
    transaction keeps what it held before and its lock_timeout is back to the migration's."""
    conn = baseline_db.connect()
    holder = psycopg.connect(baseline_db.conninfo)
    holder.execute("LOCK TABLE pgflow.step_tasks IN ACCESS SHARE MODE")
    conn.execute("SET deadlock_timeout = '200ms'")
    try:
        with pytest.raises(LateLocksBusy, match="step_tasks"), conn.transaction():
            conn.execute("LOCK TABLE pgflow.steps IN SHARE ROW EXCLUSIVE MODE")
            try:
                take_late_locks(conn, [TableLock("pgflow.step_tasks", "ACCESS EXCLUSIVE")], lock_timeout=7)
            finally:
                assert conn.execute("SHOW lock_timeout").fetchone()[0] == "7s"
    finally:
        holder.close()

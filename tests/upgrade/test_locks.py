"""Lock timeouts: the migration waits, names the blocker (never its query), retries, gives up with exit 4."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from pgflow_cli import installer
from pgflow_cli.errors import ExitCode, StateConflict
from tests.support.cli import run_cli
from tests.support.fingerprint import fingerprint
from tests.support.levels import versions_after
from tests.upgrade.conftest import bulk_finished_runs


def _blocker(database):
    """A 'worker' idle in a transaction that holds a row lock on a task (RowShare on step_tasks)."""
    conn = psycopg.connect(database.conninfo, application_name="pgflow-worker")
    conn.execute("SELECT 1 FROM pgflow.step_tasks WHERE status = 'queued' LIMIT 1 FOR UPDATE")
    pid = conn.info.backend_pid
    return conn, pid


def test_never_getting_the_lock_ends_with_exit_4_and_names_the_blocker(pre_upgrade):
    database, _state = pre_upgrade
    blocker, pid = _blocker(database)
    before = fingerprint(database.conninfo)
    try:
        result = run_cli("migrate", "apply", "--dsn", database.conninfo, "--lock-timeout", "0.5", "--retries", "2")
    finally:
        blocker.rollback()
        blocker.close()
    assert result.code == ExitCode.LOCK_TIMEOUT, result.output
    assert f"pid {pid} (pgflow-worker" in result.stderr
    assert "idle in transaction" in result.stderr
    assert "rolled back, retrying" in result.stderr
    assert "FOR UPDATE" not in result.output  # the blocker's query text is never shown
    assert "gave up after 2 attempt(s)" in result.stderr
    assert fingerprint(database.conninfo).differences(before) == []


def _lock_wait_behind(observer, blocker_pid: int, *, not_in, deadline: float):
    """Wait until some backend waits for a lock ``blocker_pid`` holds, in a transaction whose start
    is not in ``not_in``; returns that transaction's start (a new one means the migration retried)."""
    while True:
        row = observer.execute(
            "SELECT xact_start FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND %s = ANY (pg_blocking_pids(pid)) AND NOT (xact_start = ANY (%s)) LIMIT 1",
            (blocker_pid, list(not_in))).fetchone()
        if row:
            return row[0]
        assert time.monotonic() < deadline, "the migration never waited for the blocker's lock"
        time.sleep(0.02)


def test_a_blocker_that_lets_go_is_waited_out(pre_upgrade):
    database, _state = pre_upgrade
    blocker, pid = _blocker(database)
    observer = database.connect()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgflow_cli", "migrate", "apply", "--dsn", database.conninfo,
         # 2 s per wait: the migrator's lock watcher samples every 0.25 s on its own connection, and
         # on a machine loaded far past its cores two 0.5 s waits passed without one sample
         "--lock-timeout", "2", "--retries", "10"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        deadline = time.monotonic() + 120
        # let go only after the migration waited, timed out, rolled back and waited again
        first = _lock_wait_behind(observer, pid, not_in=[], deadline=deadline)
        _lock_wait_behind(observer, pid, not_in=[first], deadline=deadline)
        blocker.rollback()
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        blocker.close()
    assert proc.returncode == ExitCode.OK, err
    assert f"pid {pid}" in err and "applied 0003_queue_stage" in err


def test_two_migrators_never_interleave(baseline_db):
    holder = baseline_db.connect()
    holder.execute("SELECT pg_advisory_lock(1885824631, 0)")
    conn = baseline_db.connect()
    with pytest.raises(StateConflict) as info:
        installer.apply(conn, lock_wait=1.0)
    assert f"pid {holder.info.backend_pid}" in info.value.message
    holder.execute("SELECT pg_advisory_unlock(1885824631, 0)")
    assert [a.migration.version for a in installer.apply(conn)] == [3, *versions_after(3)]


def test_killing_the_client_mid_migration_leaves_the_database_unchanged(pre_upgrade):
    database, _state = pre_upgrade
    conn = database.connect()
    bulk_finished_runs(conn, 30000)  # 90k tasks: the one-transaction backfill takes a few seconds
    before = fingerprint(database.conninfo)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgflow_cli", "migrate", "apply", "--dsn", database.conninfo, "--online", "never"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )
    try:
        backend = None
        deadline = time.monotonic() + 60
        while backend is None and time.monotonic() < deadline:
            row = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'pgflow-cli' "
                "AND state = 'active' "
                "AND query LIKE '%%SET queue_name = pg_catalog.lower%%'").fetchone()
            backend = row[0] if row else None
            time.sleep(0.02)
        assert backend is not None, "the migration never reached its backfill"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        # the server notices the dead client when the statement ends, and rolls back
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (backend,)).fetchone()[0]:
            assert time.monotonic() < deadline, "the orphaned backend did not finish"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert fingerprint(database.conninfo).differences(before) == []
    assert [s.state for s in installer.make_plan(conn).statuses] == ["applied", "applied"] + ["pending"] * (1 + len(versions_after(3)))


def test_a_migrator_of_another_database_is_not_named_as_the_holder(baseline_db, empty_db):
    """Advisory locks belong to one database: the refusal names this database's migrator only
    (before the fix it named whichever holder of the server pg_locks listed first)."""
    elsewhere = empty_db.connect()
    elsewhere.execute("SELECT pg_advisory_lock(1885824631, 0)")
    holder = baseline_db.connect()
    holder.execute("SELECT pg_advisory_lock(1885824631, 0)")
    conn = baseline_db.connect()
    with pytest.raises(StateConflict) as info:
        installer.apply(conn, lock_wait=1.0)
    named = " ".join([info.value.message, *(info.value.detail or [])])
    assert f"pid {holder.info.backend_pid}" in named
    assert f"pid {elsewhere.info.backend_pid}" not in named
    holder.execute("SELECT pg_advisory_unlock(1885824631, 0)")
    elsewhere.execute("SELECT pg_advisory_unlock(1885824631, 0)")

"""``kill -9`` of the migrator in the middle of every phase of 0003's phased plan is recoverable.

For each phase a real process runs the phased path (tests/upgrade/stoppable_apply.py); the test makes
the phase wait in the middle (a lock the phase needs, a row it updates, a snapshot the concurrent
index build waits for), kills the process with SIGKILL and lets the server notice. Whatever the
phase had not committed is gone; the baseline runtime keeps working; then ``pgflow migrate apply``
resumes to the state of a fresh install, or ``pgflow migrate abort 3`` returns to the baseline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psycopg
import pytest

from pgflow_cli import installer
from pgflow_cli.errors import ExitCode
from tests.layout.catalog import differences, identity
from tests.support.cli import run_cli
from tests.support.fingerprint import fingerprint
from tests.upgrade.conftest import BaselineDriver, bulk_finished_runs
from tests.worker.helpers import wait_until

PHASES = ("prepare", "backfill", "validate", "index", "main")
COMMITTED_BEFORE = {"prepare": [], "backfill": ["prepare"], "validate": ["prepare", "backfill"],
                    "index": ["prepare", "backfill", "validate"], "main": ["prepare", "backfill", "validate", "index"]}
"""The phases committed when the phase named is killed part way."""


def _block(phase: str, conninfo: str) -> psycopg.Connection:
    """A session (in an open transaction) that makes ``phase`` wait in the middle."""
    blocker = psycopg.connect(conninfo, application_name="blocker")
    if phase in ("prepare", "main"):
        # both rechecks read pgmq.meta, after the phase took its table locks
        blocker.execute("LOCK TABLE pgmq.meta IN ACCESS EXCLUSIVE MODE")
    elif phase == "backfill":
        blocker.execute("SELECT 1 FROM pgflow.step_tasks ORDER BY ctid LIMIT 1 FOR UPDATE")
    elif phase == "validate":
        blocker.execute("LOCK TABLE pgflow.step_tasks IN SHARE UPDATE EXCLUSIVE MODE")
    else:  # the concurrent build waits for every older snapshot
        blocker.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        blocker.execute("SELECT 1")
    return blocker


def _waiting(observer: psycopg.Connection, phase: str) -> int | None:
    """The migrator's backend once it waits in ``phase`` (a lock, or the build's wait for snapshots)."""
    row = observer.execute(
        "SELECT a.pid FROM pg_stat_activity AS a WHERE a.datname = current_database() "
        "AND a.application_name = 'pgflow-cli' AND a.wait_event_type = 'Lock' "
        "AND (%s <> 'index' OR a.query LIKE 'CREATE %%INDEX CONCURRENTLY%%')", (phase,)).fetchone()
    return row[0] if row else None


def _kill_in(database, phase: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    proc = subprocess.Popen([sys.executable, "-m", "tests.upgrade.stoppable_apply", database.conninfo, phase],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    observer = database.connect()
    blocker = None
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        assert line == f"PHASE {phase}\n", (line, proc.stderr.read() if proc.stderr else "")
        blocker = _block(phase, database.conninfo)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        backend = wait_until(lambda: _waiting(observer, phase), f"the migrator to wait in phase {phase}", timeout=60)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        blocker.rollback()  # the backend goes on, finds its client gone and rolls back what it did not commit
        wait_until(lambda: not observer.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                                (backend,)).fetchone()[0], "the orphaned backend to end", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        if blocker is not None:
            blocker.close()


def _states(conn) -> dict:
    return {s.version: (s.state, s.recorded.phases_done if s.recorded else None)
            for s in installer.make_plan(conn).statuses}


@pytest.mark.parametrize("recovery", ["resume", "abort"])
@pytest.mark.parametrize("phase", PHASES)
def test_a_kill_in_the_middle_of_a_phase_is_resumed_or_aborted(phase, recovery, pre_upgrade, db):
    database, state = pre_upgrade
    conn = database.connect()
    bulk_finished_runs(conn, 300)  # 900 more tasks: the backfill spans several ranges
    before = fingerprint(database.conninfo)

    _kill_in(database, phase)

    done = COMMITTED_BEFORE[phase]
    assert _states(conn)[3] == (("in_progress", done) if done else ("pending", None))
    # until main commits, the baseline runtime (protocol 1) keeps working
    assert conn.execute("SELECT pgflow.protocol_version()").fetchone()[0] == 1
    driver = BaselineDriver(conn, state.old_worker)
    run = driver.start("orderFlow", {"order": phase})
    [task] = driver.claim("orderFlow", run, "validate")
    driver.complete(task, {"ok": True})

    if recovery == "abort":
        aborted = run_cli("migrate", "abort", "3", "--yes", "--dsn", database.conninfo)
        if not done:
            assert aborted.code == ExitCode.CONFLICT and "not in progress" in aborted.stderr
        else:
            assert aborted.code == ExitCode.OK, aborted.output
            assert 3 not in {v for v, (s, _) in _states(conn).items() if s != "pending"}
            after = fingerprint(database.conninfo)
            assert after.schema == before.schema  # the baseline's schema again (the data moved on: a run above)
    resumed = run_cli("migrate", "apply", "--dsn", database.conninfo)
    assert resumed.code == ExitCode.OK, resumed.output
    assert _states(conn)[3] == ("applied", [])
    with db.connect() as fresh:
        assert differences(identity(conn), identity(fresh)) == []
    assert conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE queue_name IS NULL").fetchone()[0] == 0

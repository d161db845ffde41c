"""A report that waits for a migration's lock while the migration adds a column to step_tasks.

``complete_task`` returns ``SETOF pgflow.step_tasks``. A session that knows that row type (it
caches it) starts the statement with the old shape and then waits inside the function for the
migration's lock; the function, running after the migration committed, returns the new shape:
SQLSTATE 42804 "wrong record type supplied in RETURN NEXT", and the call is rolled back. The
reference worker used to take that for a refused output and failed a task whose handler had
succeeded. It sends the same report again; the task completes with its output.
"""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from pgflow_cli.worker import Flow, ProtocolV1, Worker
from pgflow_cli.worker.failures import TaskFailure
from pgflow_cli.worker.protocol import ClaimedTask
from tests.runtime.driver import wait_until_blocked

FLOW = "reshaped"


def _claimed_tasks(conn: psycopg.Connection, count: int) -> list[ClaimedTask]:
    conn.execute("SELECT pgflow.create_flow(%s, max_attempts => 1)", (FLOW,))
    conn.execute("SELECT pgflow.add_step(%s, 'only')", (FLOW,))
    conn.execute("SELECT pgflow.start_flow(%s, '{}'::jsonb) FROM generate_series(1, %s)", (FLOW, count))
    protocol, worker_id = ProtocolV1(), str(uuid.uuid4())
    protocol.register(conn, worker_id=worker_id, function_name="w", queue_name=FLOW, flow_slug=FLOW, step_slug=None)
    ids = protocol.read(conn, queue_name=FLOW, vt=300, qty=count, max_poll_seconds=1, poll_interval_ms=20)
    tasks = protocol.claim(conn, flow_slug=FLOW, step_slug=None, queue_name=FLOW, message_ids=ids,
                           worker_id=worker_id).claimed
    assert len(tasks) == count
    return tasks


def _reshape_while(database, report: threading.Thread, pid: int) -> None:
    """What a migration that adds a step_tasks column does to a call in flight: the column is
    added under ACCESS EXCLUSIVE, then ``report`` starts and waits for that lock inside
    complete_task, then the change commits. (0003's ``queue_name`` and 0009's ``execution_mode``
    do this under live traffic: tests/upgrade/test_live_traffic.py sees it in most runs; this test
    builds the interleaving with a plain ALTER so it does not depend on what else the session
    cached.)"""
    migration = database.connect(autocommit=False)
    migration.execute("ALTER TABLE pgflow.step_tasks ADD COLUMN reshaped integer")
    report.start()
    observer = database.connect()
    wait_until_blocked(observer, pid, deadline=60)  # the report waits for the migration's lock
    migration.commit()
    report.join(60)


def test_the_call_itself_fails_with_42804_and_records_nothing(baseline_db):
    admin = baseline_db.connect()
    *warm, waiting = _claimed_tasks(admin, 7)
    session = baseline_db.connect()
    for task in warm:  # the session caches step_tasks' row type (and psycopg prepares the statement)
        ProtocolV1().complete(session, task, {"n": 1})
    errors: list[psycopg.Error] = []

    def report() -> None:
        try:
            ProtocolV1().complete(session, waiting, {"n": 2})
        except psycopg.Error as exc:
            errors.append(exc)

    _reshape_while(baseline_db, threading.Thread(target=report), session.info.backend_pid)
    assert [e.sqlstate for e in errors] == ["42804"]
    status = admin.execute("SELECT status FROM pgflow.step_tasks WHERE run_id = %s", (waiting.run_id,)).fetchone()
    assert status == ("started",)  # rolled back: nothing was recorded, so sending it again is safe


@pytest.mark.parametrize("ok", [True, False], ids=["completion", "failure"])
def test_the_reference_worker_sends_the_report_again(baseline_db, ok):
    admin = baseline_db.connect()
    *warm, waiting = _claimed_tasks(admin, 7)
    flow = Flow(FLOW).step("only", lambda value, ctx: None)
    worker = Worker(flow, baseline_db.conninfo, function_name="w", protocol=ProtocolV1())
    with ConnectionPool(baseline_db.conninfo, min_size=1, max_size=1, kwargs={"autocommit": True}) as pool:
        worker._pool = pool  # one connection: the warm-up and the report share its cached row type
        for task in warm:
            worker._report(task, ok=True, payload={"n": 1})
        with pool.connection() as conn:
            pid = conn.info.backend_pid
        report = threading.Thread(target=worker._report, args=(waiting,),
                                  kwargs={"ok": ok, "payload": {"n": 2} if ok
                                          else TaskFailure.plain("handler error", "RuntimeError")})
        _reshape_while(baseline_db, report, pid)
    row = admin.execute("SELECT status, output, error_message FROM pgflow.step_tasks WHERE run_id = %s",
                        (waiting.run_id,)).fetchone()
    assert row == (("completed", {"n": 2}, None) if ok else ("failed", None, "handler error"))

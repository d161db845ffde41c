"""One language-neutral server boundary: a flow authored with the Python API, its queue-backed steps
run by the reference worker, its manual step completed by plain SQL from another connection inside
the application's own transaction; and the Python library doing the same on a caller's connection."""

from __future__ import annotations

import time

import psycopg
import pytest

from pgflow_cli.operations import manual_tasks
from pgflow_cli.worker import Flow, Worker, WorkerOptions


def _wait_for(admin, query, params, expected, deadline=30.0):
    end = time.monotonic() + deadline
    while (value := (admin.execute(query, params).fetchone() or [None])[0]) != expected:
        assert time.monotonic() < end, f"still {value!r}, expected {expected!r}"
        time.sleep(0.05)


def test_a_python_flow_whose_manual_task_plain_sql_completes_from_another_connection(db):
    flow = (Flow("orders")
            .step("create_order", lambda run, ctx: {"order": run["order"]})
            .step("wait_for_approval", manual=True, depends_on=["create_order"])
            .step("charge", lambda deps, ctx: {"charged": deps["wait_for_approval"]["amount"]},
                  depends_on=["wait_for_approval"]))
    admin = db.connect()
    worker = Worker(flow, db.conninfo, function_name="orders-worker",
                    options=WorkerOptions(max_poll_seconds=1, heartbeat_interval=1))
    worker.start()
    try:
        run_id = admin.execute("SELECT run_id FROM pgflow.start_flow('orders', '{\"order\": 42}')").fetchone()[0]
        state = "SELECT status FROM pgflow.step_tasks WHERE run_id = %s AND step_slug = 'wait_for_approval'"
        _wait_for(admin, state, (run_id,), "started")
        # the worker keeps polling; the manual task stays untouched (no message exists for it)
        assert admin.execute("SELECT message_id, last_worker_id FROM pgflow.step_tasks "
                             "WHERE run_id = %s AND step_slug = 'wait_for_approval'", (run_id,)).fetchone() == (None, None)

        # the application: its own approval row and the workflow's progression in one transaction
        admin.execute("CREATE TABLE public.approvals (run_id uuid PRIMARY KEY, amount integer)")
        with psycopg.connect(db.conninfo) as app:
            app.execute("INSERT INTO public.approvals VALUES (%s, 100)", (run_id,))
            app.execute("""SELECT pgflow.complete_manual_task(%s, 'wait_for_approval', 0,
                                                              jsonb_build_object('amount', 100))""", (run_id,))
        _wait_for(admin, "SELECT status FROM pgflow.runs WHERE run_id = %s", (run_id,), "completed")
    finally:
        worker.stop()
        assert worker.join(30)
    assert admin.execute("SELECT output FROM pgflow.runs WHERE run_id = %s", (run_id,)).fetchone()[0] == {
        "charge": {"charged": 100}}
    assert worker.fatal is None


def test_the_library_joins_the_callers_transaction_and_a_refusal_keeps_it_usable(db, rt, author):
    author(Flow("lib").map("each", manual=True))
    run = rt.start("lib", ["x", "y"])
    conn = psycopg.connect(db.conninfo)  # plain application connection, not autocommit
    conn.execute("CREATE TEMP TABLE decisions (idx integer)")
    with conn.transaction():
        conn.execute("INSERT INTO decisions VALUES (0)")
        assert manual_tasks.complete(conn, run, "each", 0, "yes").status == "completed"
        with pytest.raises(manual_tasks.ManualTaskConflict) as conflict:
            manual_tasks.complete(conn, run, "each", 0, "no")
        assert conflict.value.code == "manual_task_conflict" and conflict.value.exit_code == 6
        # the savepoint rolled back only the refused call
        assert manual_tasks.complete(conn, run, "each", 0, "yes").status == "completed"
        waiting = manual_tasks.list_waiting(conn, flow_slug="lib")
        assert [(t.step_slug, t.task_index, t.waiting) for t in waiting] == [("each", 1, True)]
        # not visible outside before commit
        assert rt.task(run, "each", 0)["status"] == "started"
    conn.commit()
    assert rt.task(run, "each", 0)["status"] == "completed"
    assert conn.execute("SELECT count(*) FROM decisions").fetchone()[0] == 1

    done = manual_tasks.fail(conn, run, "each", 1, "no thanks")
    assert (done.status, done.run_status, done.error_message) == ("failed", "failed", "no thanks")
    with pytest.raises(manual_tasks.ManualTaskNotFound):
        manual_tasks.complete(conn, run, "each", 5, 1)
    with pytest.raises(manual_tasks.ManualTaskConflict):  # completed earlier, the run failed since
        manual_tasks.fail(conn, run, "each", 0, "too late")
    assert manual_tasks.show(conn, run, "each", 0).status == "completed"

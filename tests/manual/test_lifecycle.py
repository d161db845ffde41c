"""Manual steps: single, array-returning and map steps wait durably with no PGMQ message, and
completion or failure progresses them through the same core as a worker (docs/manual-tasks.md)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_cli.worker import protocol
from pgflow_cli.worker.flow import Flow
from tests.runtime.driver import raises_sqlstate


def complete(rt, run, step, index, output):
    return rt.one("SELECT * FROM pgflow.complete_manual_task(%s, %s, %s, %s)", (run, step, index, Jsonb(output)))


def fail(rt, run, step, index, error):
    return rt.one("SELECT * FROM pgflow.fail_manual_task(%s, %s, %s, %s)", (run, step, index, error))


def queue_rows(rt, queue: str) -> int:
    """Messages in the queue and its archive (every message ever sent and not deleted)."""
    return rt.val(f"SELECT (SELECT count(*) FROM pgmq.q_{queue}) + (SELECT count(*) FROM pgmq.a_{queue})")


def test_a_manual_single_step_waits_without_a_message_then_releases_its_child(rt, author):
    author(Flow("approvals").step("approve", manual=True).step("charge", lambda i, c: i, depends_on=["approve"]))
    run = rt.start("approvals", {"order": 7})

    [task] = rt.tasks(run)
    assert (task["step_slug"], task["task_index"], task["status"], task["execution_mode"]) == ("approve", 0, "started", "manual")
    assert (task["queue_name"], task["message_id"], task["last_worker_id"], task["attempts_count"]) == (None, None, None, 1)
    assert queue_rows(rt, "approvals") == 0  # nothing was sent
    assert rt.read("approvals") == []  # a worker polling the flow's queue finds nothing to claim

    done = complete(rt, run, "approve", 0, {"approved_by": "ops"})
    assert (done["status"], done["output"]) == ("completed", {"approved_by": "ops"})
    assert rt.statuses(run) == {"approve": "completed", "charge": "started"}
    # the child got a normal queue-backed task, with the manual step's output as its input
    [claimed] = rt.poll("approvals")
    assert claimed["input"] == {"approve": {"approved_by": "ops"}}
    rt.complete(run, "charge", 0, "charged")
    assert (rt.run(run)["status"], rt.run(run)["output"]) == ("completed", {"charge": "charged"})


def test_an_array_step_feeds_a_map_step_and_a_manual_map_aggregates_in_task_index_order(rt, author):
    author(
        Flow("batch")
        .step("requests", manual=True)  # "array" step: a manual single step returning a list
        .map("each_approval", manual=True, array="requests")
        .step("report", lambda i, c: i, depends_on=["each_approval"])
    )
    run = rt.start("batch", {})
    complete(rt, run, "requests", 0, ["a", "b", "c"])
    tasks = rt.tasks(run, "each_approval")
    assert [(t["task_index"], t["status"], t["execution_mode"], t["message_id"]) for t in tasks] == [
        (0, "started", "manual", None), (1, "started", "manual", None), (2, "started", "manual", None)]
    # finish out of order: the step output is still in task_index order
    for index in (2, 0):
        complete(rt, run, "each_approval", index, f"ok-{index}")
        assert rt.steps(run)["each_approval"]["status"] == "started"
    complete(rt, run, "each_approval", 1, "ok-1")
    assert rt.steps(run)["each_approval"]["output"] == ["ok-0", "ok-1", "ok-2"]
    [claimed] = rt.poll("batch")
    assert claimed["input"] == {"each_approval": ["ok-0", "ok-1", "ok-2"]}
    rt.complete(run, "report", 0, None)
    assert rt.run(run)["status"] == "completed"


def test_a_root_manual_map_gets_one_task_per_input_item_and_an_empty_one_completes_taskless(rt, author):
    author(Flow("rootMap").map("check", manual=True))
    run = rt.start("rootMap", [{"id": 1}, {"id": 2}])
    assert [t["task_index"] for t in rt.tasks(run)] == [0, 1]
    complete(rt, run, "check", 1, True)
    complete(rt, run, "check", 0, False)
    assert (rt.run(run)["status"], rt.run(run)["output"]) == ("completed", {"check": [False, True]})

    empty = rt.start("rootMap", [])
    assert rt.tasks(empty) == []
    assert (rt.run(empty)["status"], rt.run(empty)["output"]) == ("completed", {"check": []})


def test_a_non_array_for_a_map_fails_the_run_with_a_type_violation_and_keeps_the_output(rt, author):
    author(Flow("typed").step("requests", manual=True).map("each", manual=True, array="requests"))
    run = rt.start("typed", {})
    task = complete(rt, run, "requests", 0, {"not": "a list"})
    assert task["status"] == "failed" and task["error_message"].startswith("[TYPE_VIOLATION]")
    assert task["output"] == {"not": "a list"}
    assert rt.run(run)["status"] == "failed"
    # the same call again is the same completion: the stored task, no second transition
    assert complete(rt, run, "requests", 0, {"not": "a list"})["failed_at"] == task["failed_at"]


@pytest.mark.parametrize(
    ("when_exhausted", "run_status", "steps"),
    [
        ("fail", "failed", {"gate": "failed", "after": "created", "side": "started"}),
        ("skip", "started", {"gate": "skipped", "after": "started", "side": "started"}),
        ("skip-cascade", "started", {"gate": "skipped", "after": "skipped", "side": "started"}),
    ],
)
def test_manual_failure_does_not_retry_and_follows_when_exhausted(rt, author, when_exhausted, run_status, steps):
    author(
        Flow("gated", max_attempts=5)
        .step("gate", manual=True, when_exhausted=when_exhausted)
        .step("side", lambda i, c: i)
        .step("after", lambda i, c: i, depends_on=["gate"])
    )
    run = rt.start("gated", {})
    task = fail(rt, run, "gate", 0, "rejected by reviewer")
    assert (task["status"], task["error_message"], task["attempts_count"]) == ("failed", "rejected by reviewer", 1)
    assert rt.run(run)["status"] == run_status
    assert rt.statuses(run) == steps
    side = rt.task(run, "side")
    assert side["status"] == ("cancelled" if when_exhausted == "fail" else "queued")
    if when_exhausted == "skip":
        assert rt.poll("gated") and rt.tasks(run, "after")[0]["status"] == "started"


def test_worker_completion_and_failure_refuse_a_manual_task(rt, author):
    author(Flow("refusing").step("approve", manual=True))
    run = rt.start("refusing", {})
    with raises_sqlstate("PF010", "manual task"):
        rt.complete(run, "approve", 0, "forged")
    with raises_sqlstate("PF010", "manual task"):
        rt.fail(run, "approve", 0, "forged")
    assert rt.task(run, "approve")["status"] == "started"


def test_the_manual_entry_points_refuse_a_queue_backed_task(rt, author):
    author(Flow("queued").step("work", lambda i, c: i))
    run = rt.start("queued", {})
    with raises_sqlstate("PF010", "queue-backed"):
        complete(rt, run, "work", 0, 1)
    with raises_sqlstate("PF010", "queue-backed"):
        fail(rt, run, "work", 0, "no")
    assert rt.task(run, "work")["status"] == "queued"


def test_stalled_recovery_ignores_manual_tasks(rt, author):
    author(Flow("patient", timeout=1).step("approve", manual=True))
    run = rt.start("patient", {})
    rt.conn.execute("ALTER TABLE pgflow.step_tasks DISABLE TRIGGER USER")
    rt.conn.execute("UPDATE pgflow.step_tasks SET started_at = now() - interval '1 day', queued_at = now() - interval '1 day'"
                    " WHERE run_id = %s", (run,))
    rt.conn.execute("ALTER TABLE pgflow.step_tasks ENABLE TRIGGER USER")
    assert rt.val("SELECT pgflow.requeue_stalled_tasks()") == 0
    task = rt.task(run, "approve")
    assert (task["status"], task["requeued_count"], task["permanently_stalled_at"]) == ("started", 0, None)


def test_the_schema_keeps_queue_identity_for_queue_tasks_and_none_for_manual_ones(rt, author):
    author(Flow("checked").step("approve", manual=True).step("work", lambda i, c: i))
    run = rt.start("checked", {})
    for change in ("message_id = 99", "status = 'queued'", "last_worker_id = gen_random_uuid()"):
        with raises_sqlstate("23514"):
            rt.conn.execute(f"UPDATE pgflow.step_tasks SET {change} WHERE run_id = %s AND step_slug = 'approve'", (run,))
    with raises_sqlstate("55000"):  # queue_name stays an immutable snapshot, NULL included
        rt.conn.execute("UPDATE pgflow.step_tasks SET queue_name = 'checked' WHERE run_id = %s AND step_slug = 'approve'", (run,))
    with raises_sqlstate("23514"):  # a queue-backed task still needs its queue
        rt.conn.execute("INSERT INTO pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, message_id) "
                        "VALUES ('checked', %s, 'work', 1, 5)", (run,))
    with raises_sqlstate("55000"):  # the execution mode is an immutable snapshot
        rt.conn.execute("UPDATE pgflow.step_tasks SET execution_mode = 'queue', queue_name = 'checked' "
                        "WHERE run_id = %s AND step_slug = 'approve'", (run,))


def test_compilation_persists_the_mode_and_a_switch_is_a_shape_change(rt, db, author):
    manual = Flow("switchy").step("approve", manual=True).step("after", lambda i, c: i, depends_on=["approve"])
    verdict = author(manual)
    assert verdict["routes"] == [{"stepSlug": "approve", "queueName": None}, {"stepSlug": "after", "queueName": "switchy"}]
    assert rt.val("SELECT pgflow._get_flow_shape('switchy')")["steps"][0]["executionMode"] == "manual"
    assert "executionMode" not in rt.val("SELECT pgflow._get_flow_shape('switchy')")["steps"][1]
    assert author(manual)["status"] == "verified"

    queued = Flow("switchy").step("approve", lambda i, c: i).step("after", lambda i, c: i, depends_on=["approve"])
    with db.connect() as conn, pytest.raises(protocol.FlowShapeMismatch) as refused:
        protocol.ProtocolV2().compile(conn, "switchy", queued.shape(), None)
    assert "execution mode differs: worker queue, database manual" in str(refused.value.detail)
    assert rt.val("SELECT execution_mode FROM pgflow.steps WHERE flow_slug = 'switchy' AND step_slug = 'approve'") == "manual"


def test_the_database_validates_the_mode_and_the_route_map(rt):
    shape = Flow("bad").step("approve", manual=True).shape()
    shape["steps"][0]["executionMode"] = "later"
    with raises_sqlstate("PF003") as refused:
        rt.conn.execute("SELECT pgflow.ensure_flow_compiled('bad', %s, protocol_version => 2, route_map => NULL)", (Jsonb(shape),))
    assert "executionMode must be queue or manual" in refused.error.diag.message_detail
    # a worker that routes a manual step to a queue disagrees with the database
    shape["steps"][0]["executionMode"] = "manual"
    with raises_sqlstate("PF003", "route map"):
        rt.conn.execute("SELECT pgflow.ensure_flow_compiled('bad', %s, protocol_version => 2, route_map => %s)",
                        (Jsonb(shape), Jsonb([{"stepSlug": "approve", "queueName": "bad"}])))


def test_the_python_api_refuses_handlers_on_manual_steps_and_manual_steps_without_one():
    from pgflow_cli.worker import DefinitionError

    with pytest.raises(DefinitionError, match="has no handler"):
        Flow("api").step("approve", lambda i, c: i, manual=True)
    with pytest.raises(DefinitionError, match="needs a handler"):
        Flow("api").step("work")
    assert Flow("api").map("each", manual=True).shape()["steps"][0]["executionMode"] == "manual"


def test_a_transaction_that_rolls_back_leaves_the_task_waiting(rt, db, author):
    author(Flow("undo").step("approve", manual=True))
    run = rt.start("undo", {})
    with psycopg.connect(db.conninfo) as app:  # not autocommit: the application's transaction
        app.execute("CREATE TEMP TABLE approvals (run_id uuid)")
        app.execute("INSERT INTO approvals VALUES (%s)", (run,))
        app.execute("SELECT pgflow.complete_manual_task(%s, 'approve', 0, '\"yes\"')", (run,))
        app.rollback()
    assert rt.task(run, "approve")["status"] == "started"
    assert rt.run(run)["status"] == "started"

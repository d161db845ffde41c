"""A manual step in a step-queued flow (0005 private step queues + 0009 manual tasks).

Step-mode provisioning gives every queue-backed step its private queue and a manual step none:
the route map (Python and SQL alike) lists the manual step with ``queueName`` null, no PGMQ queue
is created or reserved for it, its name's length never rejects the flow, no worker can be started
for it, and ``pgflow coverage`` does not ask for one. A run goes through both kinds of task.
"""

from __future__ import annotations

import pytest
from psycopg.types.json import Jsonb

from pgflow_cli.operations.coverage import check_coverage
from pgflow_cli.worker import DefinitionError, Flow, step_worker, with_step_queues
from tests.support.invariants import assert_runtime_invariants


def noop(value, ctx):
    return value


def approval_flow(slug: str = "orders", manual_slug: str = "approve") -> Flow:
    return (Flow(slug, max_attempts=1, base_delay=0)
            .step("fetch", noop)
            .step(manual_slug, manual=True, depends_on=["fetch"])
            .step("ship", noop, depends_on=[manual_slug]))


def compile_step_mode(conn, flow: Flow, route_map=None) -> dict:
    queued = with_step_queues(flow)
    return conn.execute(
        "SELECT pgflow.ensure_flow_compiled(%s, %s, protocol_version => 2, queue_mode => 'step', route_map => %s)",
        (flow.slug, Jsonb(flow.shape()), Jsonb(queued.route_map() if route_map is None else route_map)),
    ).fetchone()[0]


def pgmq_queues(conn) -> list[str]:
    return conn.execute("SELECT coalesce(array_agg(queue_name::text ORDER BY queue_name::text), '{}') FROM pgmq.meta").fetchone()[0]


def claim_one(conn, flow_slug: str, step: str, queue: str) -> list[tuple]:
    worker = conn.execute("SELECT w FROM gen_random_uuid() AS w, pgflow.register_worker(w, 'fn', %s, %s, %s)",
                          (queue, flow_slug, step)).fetchone()[0]
    ids = [r[0] for r in conn.execute("SELECT msg_id FROM pgmq.read(%s, 30, 100)", (queue,)).fetchall()]
    return conn.execute("SELECT outcome, step_slug, task_index, run_id FROM pgflow.claim_tasks(%s, %s, %s, %s, %s)",
                        (queue, ids, worker, flow_slug, step)).fetchall()


def test_python_route_map_has_no_queue_for_the_manual_step():
    queued = with_step_queues(approval_flow())
    assert queued.routes == {"fetch": "orders__fetch", "ship": "orders__ship"}
    assert queued.route_map() == [{"stepSlug": "fetch", "queueName": "orders__fetch"},
                                  {"stepSlug": "approve", "queueName": None},
                                  {"stepSlug": "ship", "queueName": "orders__ship"}]
    with pytest.raises(DefinitionError, match="manual"):
        queued.queue_for("approve")
    with pytest.raises(DefinitionError, match="manual"):  # refused before any connection is tried
        step_worker(queued, "approve", "host=/nonexistent dbname=x connect_timeout=1", function_name="x")


def test_step_mode_provisions_queues_for_queue_steps_only_and_verifies(db):
    conn = db.connect()
    flow = approval_flow()
    result = compile_step_mode(conn, flow)
    assert (result["status"], result["queueMode"]) == ("compiled", "step")
    assert result["routes"] == with_step_queues(flow).route_map()  # SQL derives what Python sent
    assert pgmq_queues(conn) == ["orders__fetch", "orders__ship"]  # none for the manual step, no default queue
    rows = conn.execute("SELECT step_slug, execution_mode, queue_name FROM pgflow.steps ORDER BY step_index").fetchall()
    # the manual step keeps the flow's default name as its (unused) route namespace
    assert rows == [("fetch", "queue", "orders__fetch"), ("approve", "manual", "orders"), ("ship", "queue", "orders__ship")]
    again = compile_step_mode(conn, flow)
    assert (again["status"], again["routes"]) == ("verified", result["routes"])
    # a worker claiming the manual step had a queue would be routed nowhere: the map says null
    wrong = [dict(r, queueName=r["queueName"] or "orders__approve") for r in result["routes"]]
    with pytest.raises(Exception, match="route map differs"):
        compile_step_mode(db.connect(), flow, route_map=wrong)


def ten_roots_and(last: Flow) -> Flow:
    for index in range(10):
        last = last.step(f"s{index}", noop)
    return last


def test_a_step_that_cannot_get_a_queue_name_is_fine_when_it_is_manual(db):
    # 44 characters: flow__0 .. flow__9 fit 47, flow__10 does not, nor does flow__approve
    slug = "ordersWithAVeryLongConcreteSlugNameForTests4"
    assert len(slug) == 44
    as_queue_step = ten_roots_and(Flow(slug)).step("approve", noop)
    with pytest.raises(DefinitionError, match="cannot use private step queues"):
        with_step_queues(as_queue_step)
    conn = db.connect()
    with pytest.raises(Exception, match="cannot use private step queues"):  # SQL rejects it the same way
        conn.execute("SELECT pgflow.ensure_flow_compiled(%s, %s, protocol_version => 2, queue_mode => 'step')",
                     (slug, Jsonb(as_queue_step.shape())))

    as_manual_step = ten_roots_and(Flow(slug)).step("approve", manual=True)
    queued = with_step_queues(as_manual_step)
    assert queued.route_map()[10] == {"stepSlug": "approve", "queueName": None}
    conn = db.connect()
    result = compile_step_mode(conn, as_manual_step)
    assert (result["status"], result["routes"]) == ("compiled", queued.route_map())
    assert pgmq_queues(conn) == [f"{slug.lower()}__{index}" for index in range(10)]


def test_a_run_passes_the_private_queues_and_the_manual_task(db):
    conn = db.connect()
    compile_step_mode(conn, approval_flow())
    run_id = conn.execute("SELECT run_id FROM pgflow.start_flow('orders', '{\"id\": 7}')").fetchone()[0]
    assert [r[0] for r in claim_one(conn, "orders", "fetch", "orders__fetch")] == ["claimed"]
    conn.execute("SELECT pgflow.complete_task(%s, 'fetch', 0, '\"fetched\"')", (run_id,))

    task = conn.execute("SELECT status, execution_mode, queue_name, message_id FROM pgflow.step_tasks "
                        "WHERE run_id = %s AND step_slug = 'approve'", (run_id,)).fetchone()
    assert task == ("started", "manual", None, None)
    assert pgmq_queues(conn) == ["orders__fetch", "orders__ship"]  # still no queue for it

    conn.execute("SELECT pgflow.complete_manual_task(%s, 'approve', 0, '{\"ok\": true}')", (run_id,))
    [(outcome, step, _, _)] = claim_one(conn, "orders", "ship", "orders__ship")
    assert (outcome, step) == ("claimed", "ship")
    conn.execute("SELECT pgflow.complete_task(%s, 'ship', 0, '\"shipped\"')", (run_id,))
    assert conn.execute("SELECT status, output FROM pgflow.runs WHERE run_id = %s", (run_id,)).fetchone() == (
        "completed", {"ship": "shipped"})
    assert_runtime_invariants(db.connect())


def test_coverage_asks_for_workers_of_the_queue_steps_only(db):
    conn = db.connect()
    compile_step_mode(conn, approval_flow())
    report = check_coverage(conn, ["orders"])
    assert sorted((r.step_slug, r.queue_name) for r in report.routes) == [
        ("fetch", "orders__fetch"), ("ship", "orders__ship")]

"""Workers on 0003: registration checks the route; a fatal claim pauses the function until it is enabled again."""

from __future__ import annotations

import uuid

from psycopg.types.json import Jsonb

from tests.runtime.driver import raises_sqlstate
from tests.stage1.conftest import primary


def _register(rt, wid, function, queue, flow, step=None):
    rt.conn.execute("SELECT pgflow.register_worker(%s, %s, %s, %s, %s)", (wid, function, queue, flow, step))


def _nothing_registered(rt, function: str) -> None:
    assert rt.val("SELECT count(*) FROM pgflow.workers") == 0
    assert rt.val("SELECT count(*) FROM pgflow.worker_functions WHERE function_name = %s", (function,)) == 0


def test_registration_checks_the_route(rt):
    rt.flow("OrderFlow", [{"slug": "charge"}])
    wid = uuid.uuid4()
    with raises_sqlstate("PF004") as caught:
        _register(rt, wid, "fn", "orders_q", "OrderFlow")
    assert primary(caught.error) == f'worker {wid} would poll queue "orders_q", but the route of flow "OrderFlow" is queue "orderflow"'
    with raises_sqlstate("PF004", 'but the route of flow "OrderFlow" is queue "orderflow"'):
        _register(rt, wid, "fn", "OrderFlow", "OrderFlow")  # the flow slug's spelling is not the queue
    with raises_sqlstate("PF004") as caught:
        _register(rt, wid, "fn", "orderflow", "OrderFlow", "charge")
    assert primary(caught.error) == f'worker {wid} selects step "charge" of flow "OrderFlow", which has no private step queues'
    with raises_sqlstate("PF006") as caught:
        _register(rt, wid, "fn", "ghost", "ghost")
    assert primary(caught.error) == f'worker {wid} names flow "ghost", which does not exist'
    _nothing_registered(rt, "fn")

    _register(rt, wid, "fn", "orderflow", "OrderFlow")
    row = rt.one("SELECT function_name, queue_name, flow_slug, step_slug FROM pgflow.workers WHERE worker_id = %s", (wid,))
    assert row == {"function_name": "fn", "queue_name": "orderflow", "flow_slug": "OrderFlow", "step_slug": None}
    # a worker without a flow is not route-checked (its claims are: see claim_tasks)
    _register(rt, uuid.uuid4(), "fn", "anything", None)
    assert rt.val("SELECT count(*) FROM pgflow.workers") == 2


def test_fenced_function_refuses_registration_pointing_at_paused_reason(rt):
    rt.flow("fenceme", [{"slug": "a"}])
    rt.conn.execute("SELECT pgflow.track_worker_function('fenced-fn')")
    rt.conn.execute("UPDATE pgflow.worker_functions SET enabled = false WHERE function_name = 'fenced-fn'")
    wid = uuid.uuid4()
    with raises_sqlstate("PF001") as caught:
        _register(rt, wid, "fenced-fn", "fenceme", "fenceme")
    assert primary(caught.error) == (
        f'worker function "fenced-fn" is disabled (pgflow.worker_functions.enabled = false): worker {wid} may not register'
    )
    hint = caught.error.diag.message_hint
    assert "worker_functions.paused_reason" in hint and "docs/upgrade.md step 7" in hint
    assert rt.val("SELECT count(*) FROM pgflow.workers") == 0


def test_fatal_claim_pauses_and_enabling_clears_the_reason(rt):
    rt.flow("pausable", [{"slug": "a"}])
    worker = rt.worker_for("pausable")
    # genuine-looking pgflow work with no task behind it: fatal, never archived
    body = {"flow_slug": "pausable", "run_id": str(uuid.uuid4()), "step_slug": "a", "task_index": 0}
    msg_id = rt.val("SELECT pgmq.send('pausable', %s)", (Jsonb(body),))
    rows = rt.claim_outcomes("pausable", [msg_id], worker)
    assert [(r["outcome"], r["reason"]) for r in rows] == [("fatal", "task_missing")]
    fn = rt.one("SELECT * FROM pgflow.worker_functions WHERE function_name = 'test-worker'")
    assert fn["enabled"] is False and fn["paused_at"] is not None
    assert fn["paused_reason"] == f'fatal claim by worker {worker} in queue "pausable": message {msg_id} task_missing'
    assert [m["msg_id"] for m in rt.messages("pausable")] == [msg_id]

    with raises_sqlstate("PF001", "is disabled"):
        _register(rt, uuid.uuid4(), "test-worker", "pausable", "pausable")
    # touching the row (track_worker_function, other columns) keeps the reason
    rt.conn.execute("SELECT pgflow.track_worker_function('test-worker')")
    assert rt.val("SELECT paused_reason FROM pgflow.worker_functions WHERE function_name = 'test-worker'") == fn["paused_reason"]

    rt.conn.execute("SELECT pgmq.delete('pausable', %s::bigint)", (msg_id,))  # the operator fixes the cause
    rt.conn.execute("UPDATE pgflow.worker_functions SET enabled = true WHERE function_name = 'test-worker'")
    after = rt.one("SELECT enabled, paused_at, paused_reason FROM pgflow.worker_functions WHERE function_name = 'test-worker'")
    assert after == {"enabled": True, "paused_at": None, "paused_reason": None}
    _register(rt, uuid.uuid4(), "test-worker", "pausable", "pausable")

    # a plain fence (enabled = false by hand) records no reason
    rt.conn.execute("UPDATE pgflow.worker_functions SET enabled = false WHERE function_name = 'test-worker'")
    assert rt.val("SELECT paused_reason FROM pgflow.worker_functions WHERE function_name = 'test-worker'") is None
    rt.conn.execute("UPDATE pgflow.worker_functions SET enabled = true WHERE function_name = 'test-worker'")

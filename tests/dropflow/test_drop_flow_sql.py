"""pgflow.drop_flow / drop_flow_plan on the real server: every run state, refusals, queues gone or
shared, mixed-case listings, unknown and case-variant slugs, plain and step-queued flows."""

from __future__ import annotations

import uuid

from psycopg.types.json import Jsonb

from pgflow_cli.worker import Flow, with_step_queues
from tests.dropflow.helpers import ARCHIVE_LOG, assert_gone, build_every_state, drop, plan_of
from tests.runtime.driver import raises_sqlstate
from tests.stage1.conftest import old_rt, upgrade  # noqa: F401  (fixture)


def test_every_state_of_a_plain_flow_goes_and_nothing_else(rt):
    runs = build_every_state(rt, "Doomed")
    rt.flow("survivor", [{"slug": "a"}])
    keep = rt.start("survivor", {"keep": True})
    before = plan_of(rt, "Doomed")
    assert before["verdict"] == "needs_force"  # started runs, a live worker, no fence
    assert before["rows"]["runs"] == len(runs) and before["rows"]["flows"] == 1
    assert set(before["by_status"]["runs"]) == {"started", "completed", "failed"}
    assert {"created", "started", "completed", "failed", "skipped"} <= set(before["by_status"]["step_states"])
    assert {"queued", "started", "completed", "failed", "cancelled"} <= set(before["by_status"]["step_tasks"])
    [queue] = before["queues"]
    assert (queue["queue_name"], queue["listed_as"], queue["state"], queue["problems"]) == ("doomed", "doomed", "present", [])
    assert queue["messages"] == rt.val("SELECT count(*) FROM pgmq.q_doomed") > 0
    assert queue["archived"] == rt.val("SELECT count(*) FROM pgmq.a_doomed") > 0
    # deletion drops the tables; it never archives a message first
    rt.conn.execute(ARCHIVE_LOG)
    rt.conn.execute("CREATE TRIGGER log_archive AFTER INSERT ON pgmq.a_doomed FOR EACH ROW EXECUTE FUNCTION public.log_archive()")

    result = drop(rt, "Doomed", force=True)

    assert result["deleted"] == {**{k: before["rows"][k] for k in ("flows", "steps", "deps", "runs", "step_states", "step_tasks")},
                                 "workers": 0}
    assert result["queues"] == [{"queue_name": "doomed", "listed_as": "doomed", "outcome": "dropped",
                                 "messages": queue["messages"], "archived": queue["archived"], "leftovers": []}]
    assert rt.rows("SELECT * FROM public.archive_log") == []
    assert_gone(rt, "Doomed", ["doomed"])
    # the other flow keeps its definition, run, message and queue
    assert rt.run(keep)["status"] == "started"
    assert [m["message"]["run_id"] for m in rt.messages("survivor")] == [str(keep)]
    [task] = rt.poll("survivor")
    rt.complete(keep, "a", 0, "still works")
    assert rt.run(keep)["status"] == "completed"


def test_refuses_an_active_flow_until_it_is_fenced_and_drained(rt):
    rt.flow("busy", [{"slug": "a"}, {"slug": "b", "deps": ["a"]}])
    run = rt.start("busy", {})
    worker = rt.worker_for("busy")  # a live worker of function test-worker
    stale = uuid.uuid4()
    rt.conn.execute("SELECT pgflow.register_worker(%s, 'test-worker', 'busy', 'busy')", (stale,))
    rt.conn.execute("UPDATE pgflow.workers SET last_heartbeat_at = now() - interval '1 hour' WHERE worker_id = %s", (stale,))

    with raises_sqlstate("PF008", 'flow "busy" is still active') as caught:
        drop(rt, "busy")
    assert caught.error.diag.message_detail.splitlines() == [
        "1 live worker(s) serve the flow", "1 run(s) are still started",
        "the flow is not fenced (worker_functions.enabled = false on every function of its workers)"]
    assert rt.val("SELECT count(*) FROM pgflow.runs") == 1

    # fenced, but a task is in flight: still refused
    rt.conn.execute("UPDATE pgflow.worker_functions SET enabled = false WHERE function_name = 'test-worker'")
    [task] = rt.poll("busy")
    activity = plan_of(rt, "busy")["activity"]
    assert (activity["fenced"], activity["drained"], activity["in_flight_tasks"]) == (True, False, 1)
    assert [w["state"] for w in activity["workers"]] == ["draining", "stale"]
    with raises_sqlstate("PF008", "still active") as caught:
        drop(rt, "busy")
    assert caught.error.diag.message_detail.splitlines() == ["1 run(s) are still started", "1 task(s) are in flight (started)"]

    # the in-flight task finishes: fenced and drained, the started run is abandoned on purpose
    rt.complete(run, "a", 0, "done")
    assert plan_of(rt, "busy")["verdict"] == "ready"
    result = drop(rt, "busy")
    assert result["forced"] is False and result["deleted"]["runs"] == 1
    assert result["deleted"]["workers"] == 1  # the stale row
    assert result["workers_told_to_stop"] == 1  # the draining one: its next heartbeat says stop
    assert rt.one("SELECT worker_id, deprecated_at IS NOT NULL AS told FROM pgflow.workers") == {"worker_id": worker, "told": True}
    assert rt.val("SELECT pgflow.send_heartbeat(%s)", (worker,)) is True
    assert rt.val("SELECT enabled FROM pgflow.worker_functions WHERE function_name = 'test-worker'") is False  # left alone
    assert_gone(rt, "busy", ["busy"])


def test_a_queue_dropped_by_hand_is_reported(rt):
    rt.flow("handmade", [{"slug": "a"}])
    rt.start("handmade", {})
    rt.flow("halfgone", [{"slug": "a"}])
    rt.conn.execute("SELECT pgmq.drop_queue('handmade')")
    rt.conn.execute("DROP TABLE pgmq.q_halfgone")  # archive table and meta row stay behind
    rt.require_live_messages = False

    plan = plan_of(rt, "handmade")
    assert [(q["queue_name"], q["state"], q["messages"]) for q in plan["queues"]] == [("handmade", "missing", None)]
    result = drop(rt, "handmade", force=True)
    assert result["queues"] == [{"queue_name": "handmade", "listed_as": None, "outcome": "already_gone",
                                 "messages": None, "archived": None, "leftovers": []}]
    assert_gone(rt, "handmade", ["handmade"])

    result = drop(rt, "halfgone")
    assert result["queues"] == [{"queue_name": "halfgone", "listed_as": "halfgone", "outcome": "already_gone",
                                 "messages": None, "archived": 0,
                                 "leftovers": ["dropped the leftover archive table pgmq.a_halfgone",
                                               "deleted the leftover pgmq.meta row 'halfgone'"]}]
    assert_gone(rt, "halfgone", ["halfgone"])


def test_a_mixed_case_legacy_listing_is_dropped_by_its_exact_spelling(rt):
    """Releases before queue identity listed a flow "LegacyFlow" as "LegacyFlow" in pgmq.meta (one
    table, q_legacyflow). Dropping by the generated name would leave that meta row behind."""
    rt.flow("LegacyFlow", [{"slug": "a"}])
    rt.start("LegacyFlow", {})
    rt.conn.execute("UPDATE pgmq.meta SET queue_name = 'LegacyFlow' WHERE queue_name = 'legacyflow'")
    [queue] = plan_of(rt, "LegacyFlow")["queues"]
    assert (queue["queue_name"], queue["listed_as"], queue["problems"]) == ("legacyflow", "LegacyFlow", [])

    result = drop(rt, "LegacyFlow", force=True)
    assert [(q["listed_as"], q["outcome"], q["messages"]) for q in result["queues"]] == [("LegacyFlow", "dropped", 1)]
    assert_gone(rt, "LegacyFlow", ["legacyflow"])
    assert rt.val("SELECT count(*) FROM pgmq.meta") == 0


def test_a_legacy_camelcase_flow_upgraded_from_the_baseline_is_dropped_by_its_listed_spelling(old_rt, baseline_db):
    """The same, built by the released runtime (protocol 1) and upgraded with the one installer."""
    old_rt.flow("LegacyFlow", [{"slug": "a"}, {"slug": "b", "deps": ["a"]}])
    done = old_rt.start("LegacyFlow", {})
    [task] = old_rt.poll("LegacyFlow")
    old_rt.complete(done, "a", 0, "x")
    old_rt.start("LegacyFlow", {})
    upgrade(baseline_db, old_rt)
    assert old_rt.val("SELECT array_agg(queue_name::text) FROM pgmq.meta") == ["LegacyFlow"]
    result = drop(old_rt, "LegacyFlow", force=True)
    assert [(q["queue_name"], q["listed_as"], q["outcome"], q["messages"], q["archived"]) for q in result["queues"]] == [
        ("legacyflow", "LegacyFlow", "dropped", 2, 1)]
    assert_gone(old_rt, "LegacyFlow", ["legacyflow"])
    assert old_rt.val("SELECT count(*) FROM pgmq.meta") == 0


def test_a_queue_another_meta_row_maps_to_is_refused(rt):
    rt.flow("shared", [{"slug": "a"}])
    rt.start("shared", {})
    rt.conn.execute("SELECT pgmq.create('Shared')")  # a second listing of the same tables, made outside pgflow
    plan = plan_of(rt, "shared")
    assert plan["verdict"] == "refused"
    assert plan["problems"] == ['queue "shared": several pgmq.meta rows map to its tables (Shared, shared)']

    with raises_sqlstate("PF004", 'flow "shared" cannot be dropped: 1 problem') as caught:
        drop(rt, "shared", force=True)  # force never overrides ownership
    assert caught.error.diag.message_detail == plan["problems"][0]
    assert rt.val("SELECT count(*) FROM pgflow.runs") == 1
    assert rt.val("SELECT count(*) FROM pgmq.meta") == 2


def test_a_queue_another_flow_routes_to_is_refused(rt):
    rt.flow("owner", [{"slug": "a"}])
    rt.flow("intruder", [{"slug": "a"}])
    # a step route pgflow would never write (hand-edited): the queue is no longer owner's alone
    rt.conn.execute("ALTER TABLE pgflow.steps DISABLE TRIGGER USER")
    rt.conn.execute("UPDATE pgflow.steps SET queue_name = 'owner' WHERE flow_slug = 'intruder'")
    rt.conn.execute("ALTER TABLE pgflow.steps ENABLE TRIGGER USER")
    assert plan_of(rt, "owner")["problems"] == ['queue "owner": flow "intruder" routes steps to it']
    assert plan_of(rt, "intruder")["problems"] == [
        'queue "owner": step "a" routes to queue "owner", not to the flow\'s default queue "intruder": not a generated private queue',
        'queue "owner": flow "owner" routes steps to it',
        'queue "owner": it is the default queue of flow "owner"',
    ]
    with raises_sqlstate("PF004", "cannot be dropped"):
        drop(rt, "owner", force=True)
    rt.conn.execute("ALTER TABLE pgflow.steps DISABLE TRIGGER USER")
    rt.conn.execute("UPDATE pgflow.steps SET queue_name = 'intruder' WHERE flow_slug = 'intruder'")
    rt.conn.execute("ALTER TABLE pgflow.steps ENABLE TRIGGER USER")
    drop(rt, "owner")
    assert_gone(rt, "owner", ["owner"])


def test_unknown_and_case_variant_slugs(rt):
    rt.flow("MyFlow", [{"slug": "a"}])
    with raises_sqlstate("PF006", r'flow "myflow" does not exist \(flow "MyFlow" differs only in letter case'):
        drop(rt, "myflow", force=True)
    with raises_sqlstate("PF006", 'flow "myflow" does not exist'):
        plan_of(rt, "myflow")
    with raises_sqlstate("PF006", '^flow "nothing" does not exist\n'):
        drop(rt, "nothing")
    assert rt.val("SELECT array_agg(flow_slug) FROM pgflow.flows") == ["MyFlow"]
    drop(rt, "MyFlow")
    assert_gone(rt, "MyFlow", ["myflow"])


def test_a_step_queued_flow_drops_every_private_queue(rt):
    """A step-queued flow (Stage 2, the queue stage) owns one generated queue per step; all of them go."""
    flow = Flow("Scrape").step("fetch", lambda r, c: r).step("parse", lambda d, c: d, depends_on=["fetch"])
    routes = with_step_queues(flow).route_map()
    rt.val("SELECT pgflow.ensure_flow_compiled(%s, %s, protocol_version => 2, queue_mode => 'step', route_map => %s)",
           (flow.slug, Jsonb(flow.shape()), Jsonb(routes)))
    rt.flow("survivor", [{"slug": "a"}])
    queues = sorted(r["queueName"] for r in routes)
    assert queues == ["scrape__fetch", "scrape__parse"]
    advanced = rt.start("Scrape", {"url": 1})
    rt.start("Scrape", {"url": 2})
    wid = uuid.uuid4()
    rt.conn.execute("SELECT pgflow.register_worker(%s, 'fetcher', 'scrape__fetch', 'Scrape', 'fetch')", (wid,))
    msg = rt.task(advanced, "fetch")["message_id"]
    [claimed] = rt.rows("SELECT * FROM pgflow.claim_tasks('scrape__fetch', %s::bigint[], %s, 'Scrape', 'fetch')", ([msg], wid))
    assert claimed["outcome"] == "claimed"
    rt.complete(advanced, "fetch", 0, "page")  # parse's message goes to the other private queue

    plan = plan_of(rt, "Scrape")
    assert [(q["queue_name"], q["origins"], q["messages"], q["problems"]) for q in plan["queues"]] == [
        ("scrape__fetch", ["step:fetch"], 1, []), ("scrape__parse", ["step:parse"], 1, [])]
    result = drop(rt, "Scrape", force=True)
    assert [(q["queue_name"], q["outcome"]) for q in result["queues"]] == [
        ("scrape__fetch", "dropped"), ("scrape__parse", "dropped")]
    assert_gone(rt, "Scrape", queues)
    assert rt.val("SELECT array_agg(queue_name::text) FROM pgmq.meta") == ["survivor"]

"""Definitions on 0003: generated default queues, never adopting a queue, startup compilation (protocol 2)."""

from __future__ import annotations

import json
import threading

import pytest
from psycopg.types.json import Jsonb

from tests.runtime.driver import raises_sqlstate, wait_until_blocked
from tests.stage1.conftest import primary


def step(slug: str, deps: list[str] | None = None, **extra) -> dict:
    entry = {"slug": slug, "stepType": "single", "dependencies": deps or [], "options": {}, "whenUnmet": "skip",
             "whenExhausted": "fail", "requiredInputPattern": {"defined": False},
             "forbiddenInputPattern": {"defined": False}}
    entry.update(extra)
    return entry


def shape(*steps: dict, **options) -> dict:
    return {"steps": list(steps), "options": options}


def routes(queue: str, *slugs: str) -> list[dict]:
    return [{"stepSlug": s, "queueName": queue} for s in slugs]


def compile2(rt, slug: str, doc: dict, *, protocol=2, queue_mode="flow", route_map=None) -> dict:
    """The protocol-2 startup call with explicit arguments (the driver derives the route map itself)."""
    return rt.val(
        "SELECT pgflow.ensure_flow_compiled(%s, %s, protocol_version => %s, queue_mode => %s, route_map => %s)",
        (slug, Jsonb(doc), protocol, queue_mode, None if route_map is None else Jsonb(route_map)),
    )


def _json(value) -> str:
    """jsonb's text form of route maps (PostgreSQL prints the shorter key, stepSlug, first)."""
    return json.dumps(value, separators=(", ", ": "))


def nothing_defined(rt) -> None:
    assert rt.val("SELECT count(*) FROM pgflow.flows") == 0
    assert rt.val("SELECT count(*) FROM pgflow.steps") == 0
    assert rt.val("SELECT count(*) FROM pgmq.meta") == 0


# -- default queues: lower(flow_slug), never adopted -------------------------------------------------


def test_default_queue_is_the_lowercase_flow_slug(rt):
    rt.flow("OrderFlow", [{"slug": "charge"}, {"slug": "shipIt", "deps": ["charge"]}])
    assert rt.val("SELECT array_agg(queue_name::text) FROM pgmq.meta") == ["orderflow"]
    assert rt.rows("SELECT step_slug, queue_name FROM pgflow.steps ORDER BY step_index") == [
        {"step_slug": "charge", "queue_name": "orderflow"},
        {"step_slug": "shipIt", "queue_name": "orderflow"},
    ]
    assert rt.val("SELECT queue_mode FROM pgflow.flows") == "flow"
    run = rt.start("OrderFlow", {"id": 7})
    [charge] = rt.poll("OrderFlow")  # reads queue "orderflow", claims with flow "OrderFlow"
    assert rt.last_outcomes[0]["outcome"] == "claimed"
    assert rt.task(run, "charge")["queue_name"] == "orderflow"
    assert charge["flow_input"] == {"id": 7}
    rt.complete(run, "charge", 0, "paid")
    [ship] = rt.poll("OrderFlow")
    assert ship["input"] == {"charge": "paid"}
    rt.complete(run, "shipIt", 0, "sent")
    assert rt.run(run)["status"] == "completed"
    assert [m["message"]["flow_slug"] for m in rt.archived("orderflow")] == ["OrderFlow", "OrderFlow"]


def test_create_flow_refuses_an_existing_default_queue(rt):
    """A queue pgflow did not create for this definition is never adopted, whatever its letter case."""
    rt.conn.execute("SELECT pgmq.create('taken')")
    msg = rt.val("""SELECT pgmq.send('taken', '{"app": "data"}')""")
    rt.conn.execute("SELECT pgmq.create('Shouty')")  # pgmq.meta keeps this spelling; the table is q_shouty
    rt.conn.execute("SELECT pgmq.create('lower')")
    cases = [("taken", "taken"), ("Taken", "taken"), ("shouty", "shouty"), ("SHOUTY", "shouty"), ("Lower", "lower")]
    for flow, queue in cases:
        with raises_sqlstate("PF004") as caught:
            rt.conn.execute("SELECT pgflow.create_flow(%s)", (flow,))
        assert primary(caught.error) == (
            f'a PGMQ queue named "{queue}" already exists and pgflow did not create it for flow "{flow}"; '
            "pgflow never adopts an existing queue"
        ), flow
        with raises_sqlstate("PF004", "never adopts"):
            rt.compile(flow, shape(step("a")))
    assert rt.val("SELECT count(*) FROM pgflow.flows") == 0
    assert rt.val("SELECT array_agg(queue_name::text ORDER BY queue_name) FROM pgmq.meta") == ["Shouty", "lower", "taken"]
    assert [m["msg_id"] for m in rt.messages("taken")] == [msg]  # the application's message is untouched
    rt.conn.execute("SELECT pgmq.delete('taken', %s::bigint)", (msg,))


def test_create_flow_never_adopts_a_queue_that_appears_during_provisioning(rt, db):
    app = db.connect(autocommit=False)
    app.execute("SELECT pgmq.create('raced')")  # an application provisions its own queue, not committed yet
    app.execute("""SELECT pgmq.send('raced', '{"app": "order 17"}')""")
    creator = db.connect()
    result: dict = {}

    def create():
        try:
            result["value"] = creator.execute("SELECT flow_slug FROM pgflow.create_flow('raced')").fetchall()
        except Exception as exc:  # the expected refusal
            result["error"] = exc

    thread = threading.Thread(target=create)
    thread.start()
    assert app.info.backend_pid in wait_until_blocked(rt.conn, creator.info.backend_pid)  # inside pgmq.create
    app.commit()
    thread.join(30)
    try:
        assert getattr(result.get("error"), "sqlstate", None) == "PF004", result
        assert rt.val("SELECT count(*) FROM pgflow.flows") == 0
    finally:
        rt.conn.execute("SELECT pgflow.delete_flow_and_data('raced')")  # leaves no adopted flow for the invariants


def test_create_flow_refuses_a_queue_table_without_a_meta_row(rt):
    rt.conn.execute("SELECT pgmq.create('orphan')")
    rt.conn.execute("DELETE FROM pgmq.meta WHERE queue_name = 'orphan'")
    with raises_sqlstate("PF004", 'queue named "orphan" already exists'):
        rt.conn.execute("SELECT pgflow.create_flow('orphan')")
    assert rt.val("SELECT count(*) FROM pgflow.flows") == 0


def test_create_flow_refuses_a_queue_another_flow_routes_to(rt):
    """Cross-flow collision: a persisted route is ownership evidence, checked before any change."""
    rt.flow("owner", [{"slug": "a"}])
    rt.conn.execute("UPDATE pgflow.steps SET queue_name = 'claimed' WHERE flow_slug = 'owner'")
    with raises_sqlstate("PF004") as caught:
        rt.conn.execute("SELECT pgflow.create_flow('Claimed')")
    assert primary(caught.error) == 'queue "claimed" already belongs to flow "owner"; flow "Claimed" cannot use it'
    assert rt.val("SELECT array_agg(flow_slug) FROM pgflow.flows") == ["owner"]
    assert rt.val("SELECT array_agg(queue_name::text) FROM pgmq.meta") == ["owner"]


def test_existing_flow_with_its_queue_gone_is_reported(rt):
    rt.flow("lost", [{"slug": "a"}])
    rt.conn.execute("SELECT pgmq.drop_queue('lost')")
    with raises_sqlstate("PF004", 'queue "lost" of flow "lost" is missing from PGMQ'):
        rt.conn.execute("SELECT pgflow.create_flow('lost')")
    with raises_sqlstate("PF004", "missing from PGMQ"):
        rt.compile("lost", shape(step("a")))
    assert rt.val("SELECT count(*) FROM pgmq.meta") == 0  # not silently recreated


# -- startup compilation ---------------------------------------------------------------------------------


def test_protocol_1_startup_is_refused_before_anything_happens(rt):
    assert rt.val("SELECT pgflow.protocol_version()") == 2
    with raises_sqlstate("PF002") as caught:
        rt.val("SELECT pgflow.ensure_flow_compiled('legacy', %s)", (Jsonb(shape(step("a"))),))
    assert "worker speaks pgflow protocol 1, database speaks protocol 2" in primary(caught.error)
    assert "coordinated package-and-database upgrade" in caught.error.diag.message_hint
    nothing_defined(rt)
    assert rt.val("SELECT count(*) FROM pgflow.workers") == 0


@pytest.mark.parametrize("protocol", [1, 3, None])
def test_wrong_protocol_version_is_refused(rt, protocol):
    with raises_sqlstate("PF002") as caught:
        compile2(rt, "proto", shape(step("a")), protocol=protocol)
    shown = "NULL" if protocol is None else str(protocol)
    assert primary(caught.error) == f'worker speaks pgflow protocol {shown}, database speaks protocol 2: startup of flow "proto" refused'
    nothing_defined(rt)


def test_compiled_verified_and_production_mismatches(rt):
    v1 = shape(step("a"), step("b", ["a"]))
    first = compile2(rt, "Prod", v1, route_map=routes("prod", "a", "b"))
    assert first == {"status": "compiled", "differences": [], "mismatchKind": None, "queueMode": "flow",
                     "routes": routes("prod", "a", "b")}
    assert rt.val("SELECT array_agg(queue_name ORDER BY step_index) FROM pgflow.steps") == ["prod", "prod"]
    # without a route map (optional) and with changed options: verified
    again = compile2(rt, "Prod", shape(step("a", options={"timeout": 9}), step("b", ["a"]), maxAttempts=7))
    assert again == {**first, "status": "verified"}

    run = rt.start("Prod", {})
    v2 = shape(step("a"), step("b", ["a"]), step("c", ["b"]))
    shape_mismatch = compile2(rt, "Prod", v2)
    assert (shape_mismatch["status"], shape_mismatch["mismatchKind"]) == ("mismatch", "shape")
    assert any("Step count differs" in d for d in shape_mismatch["differences"])
    assert shape_mismatch["routes"] == routes("prod", "a", "b")  # what the database has

    # a route changed by hand (steps have no immutability trigger): same shape, different routing
    rt.conn.execute("UPDATE pgflow.steps SET queue_name = 'elsewhere' WHERE flow_slug = 'Prod' AND step_slug = 'b'")
    routing = compile2(rt, "Prod", v1)
    assert (routing["status"], routing["mismatchKind"]) == ("mismatch", "routing")
    stored = [{"stepSlug": "a", "queueName": "prod"}, {"stepSlug": "b", "queueName": "elsewhere"}]
    assert routing["routes"] == stored
    assert routing["differences"] == [
        f"routes: database has {_json(stored)} (queue mode flow), "
        f"worker derives {_json(routes('prod', 'a', 'b'))} (queue mode flow)"
    ]
    # production changes nothing: definition, route, run, task and message all stay
    assert rt.val("SELECT queue_name FROM pgflow.steps WHERE step_slug = 'b'") == "elsewhere"
    assert rt.val("SELECT count(*) FROM pgflow.steps") == 2
    assert rt.run(run)["status"] == "started"
    assert len(rt.messages("prod")) == 1
    rt.conn.execute("UPDATE pgflow.steps SET queue_name = 'prod' WHERE flow_slug = 'Prod'")  # repair


def test_local_recompile_repairs_a_routing_mismatch(rt):
    v1 = shape(step("a"), step("b", ["a"]))
    compile2(rt, "dev", v1)
    run = rt.start("dev", {})
    rt.conn.execute("UPDATE pgflow.steps SET queue_name = 'stray' WHERE flow_slug = 'dev' AND step_slug = 'b'")
    rt.conn.execute("SELECT set_config('pgflow.environment', 'local', false)")
    result = compile2(rt, "dev", v1, route_map=routes("dev", "a", "b"))
    assert (result["status"], result["mismatchKind"]) == ("recompiled", "routing")
    assert result["routes"] == routes("dev", "a", "b")
    assert rt.val("SELECT array_agg(queue_name ORDER BY step_index) FROM pgflow.steps") == ["dev", "dev"]
    assert rt.run(run) is None  # a local recompile starts from scratch
    assert rt.messages("dev") == []
    assert compile2(rt, "dev", v1)["status"] == "verified"

    # a shape change recompiles locally too, with the new routes
    v2 = shape(step("a"), step("b", ["a"]), step("c", ["a"]))
    recompiled = compile2(rt, "dev", v2)
    assert (recompiled["status"], recompiled["mismatchKind"]) == ("recompiled", "shape")
    assert recompiled["routes"] == routes("dev", "a", "b", "c")


def test_an_unknown_queue_mode_is_refused(rt):
    # 'step' is provisioned since 0005 (tests/stage2/test_step_queues.py); anything else is refused
    for mode in (None, "Flow", "steps"):
        with raises_sqlstate("PF003") as caught:
            compile2(rt, "stepped", shape(step("a")), queue_mode=mode)
        assert "queue mode must be 'flow' or 'step'" in primary(caught.error)
    nothing_defined(rt)


@pytest.mark.parametrize(
    "route_map",
    [
        routes("mixed__a", "a", "b"),  # private step queues
        routes("Mixed", "a", "b"),  # not lowercased
        routes("mixed", "a"),  # a step missing
        routes("mixed", "b", "a"),  # not in step order
        [],
    ],
    ids=["step-queues", "not-lowercase", "missing-step", "wrong-order", "empty"],
)
def test_a_route_map_the_database_does_not_derive_is_refused(rt, route_map):
    doc = shape(step("a"), step("b"))
    with raises_sqlstate("PF003") as caught:
        compile2(rt, "Mixed", doc, route_map=route_map)
    assert primary(caught.error) == "flow \"Mixed\": the worker's route map differs from the routes the database derives"
    assert caught.error.diag.message_detail == f"worker: {_json(route_map)}; database: {_json(routes('mixed', 'a', 'b'))}"
    nothing_defined(rt)


def test_every_problem_of_an_invalid_shape_is_listed_before_any_change(rt):
    doc = shape(*(step(s) for s in ("good", "_lead", "trail_", "dou__ble", "9lives", "bad-char", "run", "Good")))
    with raises_sqlstate("PF003") as caught:
        compile2(rt, "invalid", doc)
    assert primary(caught.error) == 'flow "invalid": 7 problem(s) in the definition; nothing was changed'
    assert caught.error.diag.message_detail.splitlines() == [
        "step '_lead' (index 1): leading_underscore",
        "step 'trail_' (index 2): trailing_underscore",
        "step 'dou__ble' (index 3): double_underscore",
        "step '9lives' (index 4): leading_digit",
        "step 'bad-char' (index 5): invalid_character",
        "step 'run' (index 6): reserved_word",
        "step 'Good' (index 7) differs only by letter case from step 'good' (index 0)",
    ]
    nothing_defined(rt)

    # against an existing flow: refused the same way, the stored definition stays
    compile2(rt, "invalid", shape(step("good")))
    with raises_sqlstate("PF003", "1 problem") as caught:
        compile2(rt, "invalid", shape(step("good"), step("_x_")))
    assert caught.error.diag.message_detail == "step '_x_' (index 1): leading_underscore, trailing_underscore"
    assert rt.val("SELECT array_agg(step_slug) FROM pgflow.steps") == ["good"]


def test_structural_problems_of_a_shape_are_listed_with_the_slug_problems(rt):
    doc = shape(
        step("a"),
        step("b", ["ghost"]),
        step("c", stepType="loop"),
        step("m", ["a", "b"], stepType="map"),
        step("_bad"),
    )
    with raises_sqlstate("PF003") as caught:
        compile2(rt, "structural", doc)
    detail = caught.error.diag.message_detail or ""
    assert "ghost" in detail and "loop" in detail and "'m'" in detail and "'_bad'" in detail, detail
    nothing_defined(rt)

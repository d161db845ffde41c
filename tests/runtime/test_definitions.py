"""Definitions: create_flow, add_step, shapes, startup compilation, delete_flow_and_data."""

from __future__ import annotations

import pytest
from psycopg.types.json import Jsonb

from tests.runtime.driver import commit_when_blocked, raises_sqlstate


def shape(*steps: dict, **options) -> dict:
    """A worker shape document; steps are (slug, deps, extra fields)."""
    out = []
    for step in steps:
        entry = {
            "slug": step["slug"],
            "stepType": step.get("stepType", "single"),
            "dependencies": step.get("dependencies", []),
            "options": step.get("options", {}),
            "whenUnmet": step.get("whenUnmet", "skip"),
            "whenExhausted": step.get("whenExhausted", "fail"),
            "requiredInputPattern": step.get("requiredInputPattern", {"defined": False}),
            "forbiddenInputPattern": step.get("forbiddenInputPattern", {"defined": False}),
        }
        out.append(entry)
    return {"steps": out, "options": options}


def compile_(rt, slug: str, doc: dict) -> dict:
    """Startup compilation through this level's worker protocol (driver.Runtime.compile)."""
    return rt.compile(slug, doc)


def outcome(result: dict) -> dict:
    """The part of a compile result both protocols return: status and differences."""
    return {"status": result["status"], "differences": result["differences"]}


def assert_routes(rt, result: dict, slug: str, steps: list[str]) -> None:
    """Upgraded: a plain flow's result names every step's route, lower(flow_slug)."""
    if rt.upgraded:
        assert result["queueMode"] == "flow"
        assert result["routes"] == [{"stepSlug": s, "queueName": rt.queue(slug)} for s in steps]


def test_create_flow_defaults_idempotent_and_queue(rt):
    flow = rt.one("SELECT * FROM pgflow.create_flow('defaults')")
    assert (flow["opt_max_attempts"], flow["opt_base_delay"], flow["opt_timeout"]) == (3, 5, 60)
    again = rt.one("SELECT * FROM pgflow.create_flow('defaults', 9, 9, 9)")
    assert (again["opt_max_attempts"], again["opt_base_delay"], again["opt_timeout"]) == (3, 5, 60)
    assert rt.val("SELECT count(*) FROM pgmq.meta WHERE queue_name = 'defaults'") == 1
    custom = rt.one("SELECT * FROM pgflow.create_flow('custom', 1, 2, 3)")
    assert (custom["opt_max_attempts"], custom["opt_base_delay"], custom["opt_timeout"]) == (1, 2, 3)


@pytest.mark.baseline_only(
    reason="0003 never adopts an existing queue: create_flow refuses it with PF004 "
    "(tests/stage1/test_definitions.py::test_create_flow_refuses_an_existing_default_queue)"
)
def test_create_flow_reuses_an_exactly_listed_queue(rt):
    rt.conn.execute("SELECT pgmq.create('prelisted')")
    rt.conn.execute("SELECT pgmq.send('prelisted', '{\"x\": 1}')")
    rt.conn.execute("SELECT pgflow.create_flow('prelisted')")
    assert len(rt.messages("prelisted")) == 1  # not recreated
    rt.conn.execute("SELECT pgmq.delete('prelisted', 1::bigint)")


def test_create_flow_rejects_bad_input(rt):
    with raises_sqlstate("PF003", "invalid flow slug"):
        rt.conn.execute("SELECT pgflow.create_flow('1bad')")
    with raises_sqlstate("PF003", "at most 47"):
        rt.conn.execute("SELECT pgflow.create_flow(%s)", ("f" * 48,))
    with raises_sqlstate("PF003", "timeout > 0"):
        rt.conn.execute("SELECT pgflow.create_flow('badopts', timeout => 0)")
    assert rt.val("SELECT count(*) FROM pgflow.flows") == 0


def test_add_step_indexes_deps_and_idempotence(rt):
    rt.flow("steps", [{"slug": "a"}, {"slug": "b"}, {"slug": "c", "deps": ["b", "a", "a"]}])
    steps = rt.rows("SELECT step_slug, step_index, deps_count FROM pgflow.steps WHERE flow_slug = 'steps' ORDER BY step_index")
    assert [(s["step_slug"], s["step_index"], s["deps_count"]) for s in steps] == [("a", 0, 0), ("b", 1, 0), ("c", 2, 2)]
    deps = rt.rows("SELECT dep_slug FROM pgflow.deps WHERE flow_slug = 'steps' AND step_slug = 'c' ORDER BY dep_slug")
    assert [d["dep_slug"] for d in deps] == ["a", "b"]
    # idempotent: same call returns the existing row, options untouched
    again = rt.one("SELECT * FROM pgflow.add_step('steps', 'a', '{}', max_attempts => 9)")
    assert again["step_index"] == 0 and again["opt_max_attempts"] is None


def test_add_step_validation_errors(rt):
    rt.flow("val", [{"slug": "a"}, {"slug": "b"}])
    with raises_sqlstate("PF003", r'flow "nope" does not exist'):
        rt.conn.execute("SELECT pgflow.add_step('nope', 'x')")
    with raises_sqlstate("PF003", r"unknown step\(s\): ghost, phantom"):
        rt.conn.execute("SELECT pgflow.add_step('val', 'x', ARRAY['a', 'ghost', 'phantom'])")
    with raises_sqlstate("PF003", "at most one"):
        rt.conn.execute("SELECT pgflow.add_step('val', 'm', ARRAY['a', 'b'], step_type => 'map')")
    with raises_sqlstate("PF003", "step_type"):
        rt.conn.execute("SELECT pgflow.add_step('val', 'x', step_type => 'loop')")
    with raises_sqlstate("PF003", "when_unmet"):
        rt.conn.execute("SELECT pgflow.add_step('val', 'x', when_unmet => 'ignore')")
    with raises_sqlstate("PF003", "JSON objects"):
        rt.conn.execute("SELECT pgflow.add_step('val', 'x', required_input_pattern => '[1]')")
    with raises_sqlstate("PF003", "invalid step slug"):
        rt.conn.execute("SELECT pgflow.add_step('val', 'run')")
    assert rt.val("SELECT count(*) FROM pgflow.steps WHERE flow_slug = 'val'") == 2


def test_shape_round_trip(rt):
    doc = shape(
        {"slug": "fetch", "options": {"timeout": 5}},
        {"slug": "items", "stepType": "map", "dependencies": ["fetch"], "whenExhausted": "skip"},
        {"slug": "gate", "dependencies": ["items", "fetch"], "whenUnmet": "skip-cascade",
         "requiredInputPattern": {"defined": True, "value": {"fetch": {"ok": True}}}},
        maxAttempts=4, baseDelay=1, timeout=30,
    )
    result = compile_(rt, "roundtrip", doc)
    assert outcome(result) == {"status": "compiled", "differences": []}
    assert_routes(rt, result, "roundtrip", ["fetch", "items", "gate"])
    stored = rt.val("SELECT pgflow._get_flow_shape('roundtrip')")
    assert [s["slug"] for s in stored["steps"]] == ["fetch", "items", "gate"]
    assert stored["steps"][2]["dependencies"] == ["fetch", "items"]
    assert stored["steps"][2]["requiredInputPattern"] == {"defined": True, "value": {"fetch": {"ok": True}}}
    assert stored["steps"][0]["forbiddenInputPattern"] == {"defined": False}
    assert rt.val("SELECT pgflow._compare_flow_shapes(%s, %s)", (Jsonb(doc), Jsonb(stored))) == []
    flow = rt.one("SELECT * FROM pgflow.flows WHERE flow_slug = 'roundtrip'")
    assert (flow["opt_max_attempts"], flow["opt_base_delay"], flow["opt_timeout"]) == (4, 1, 30)
    assert rt.val("SELECT opt_timeout FROM pgflow.steps WHERE step_slug = 'fetch'") == 5
    # an unknown flow: NULL in the baseline, {"steps": []} as released from 0006 (docs/compatibility.md item 3)
    assert rt.val("SELECT pgflow._get_flow_shape('missing')") == ({"steps": []} if rt.upgraded else None)


def test_compare_flow_shapes_reports_every_difference(rt):
    db_doc = shape({"slug": "a"}, {"slug": "b", "dependencies": ["a"]})
    local = shape(
        {"slug": "a", "stepType": "map", "whenUnmet": "fail", "options": {"timeout": 99}},
        {"slug": "c", "dependencies": []},
        {"slug": "d"},
    )
    diffs = rt.val("SELECT pgflow._compare_flow_shapes(%s, %s)", (Jsonb(local), Jsonb(db_doc)))
    text = "\n".join(diffs)
    assert ("step count differs: worker defines 3, database has 2" if rt.level == "baseline"
            else "Step count differs: 3 vs 2") in text
    assert "step type differs" in text
    assert "whenUnmet differs" in text
    assert 'slug differs: worker "c", database "b"' in text
    assert "dependencies differ" in text
    assert '"d" is defined by the worker but missing in the database' in text
    assert "timeout" not in text  # options never count


def test_ensure_flow_compiled_verified_and_production_mismatch(rt):
    v1 = shape({"slug": "a"}, {"slug": "b", "dependencies": ["a"]})
    assert compile_(rt, "prod", v1)["status"] == "compiled"
    # options changes are not shape changes
    v1_opts = shape({"slug": "a", "options": {"maxAttempts": 9}}, {"slug": "b", "dependencies": ["a"]}, timeout=5)
    verified = compile_(rt, "prod", v1_opts)
    assert outcome(verified) == {"status": "verified", "differences": []}
    assert_routes(rt, verified, "prod", ["a", "b"])

    run = rt.start("prod", {})
    v2 = shape({"slug": "a"}, {"slug": "b", "dependencies": ["a"]}, {"slug": "c", "dependencies": ["b"]})
    result = compile_(rt, "prod", v2)
    assert result["status"] == "mismatch"
    assert any("tep count differs" in d for d in result["differences"])
    if rt.upgraded:
        assert result["mismatchKind"] == "shape"
        assert_routes(rt, result, "prod", ["a", "b"])  # the stored routes, unchanged
    # production never deletes: the run, its task and message are all still there
    assert rt.run(run)["status"] == "started"
    assert len(rt.messages("prod")) == 1
    assert rt.val("SELECT count(*) FROM pgflow.steps WHERE flow_slug = 'prod'") == 2


def test_ensure_flow_compiled_recompiles_only_when_local(rt):
    v1 = shape({"slug": "a"})
    v2 = shape({"slug": "a"}, {"slug": "z", "dependencies": ["a"]})
    compile_(rt, "dev", v1)
    run = rt.start("dev", {})
    rt.conn.execute("SELECT set_config('pgflow.environment', 'local', false)")
    assert rt.val("SELECT pgflow.is_local()") is True
    result = compile_(rt, "dev", v2)
    assert result["status"] == "recompiled"
    assert result["differences"]
    assert rt.run(run) is None  # old runs are gone with the old definition
    assert rt.val("SELECT count(*) FROM pgflow.steps WHERE flow_slug = 'dev'") == 2
    assert rt.messages("dev") == []  # fresh queue
    assert compile_(rt, "dev", v2)["status"] == "verified"


def test_local_mode_from_database_setting(rt, db):
    rt.conn.execute("SELECT pgflow.create_flow('dbset')")
    assert rt.val("SELECT pgflow.is_local()") is False
    rt.conn.execute(f'ALTER DATABASE "{db.name}" SET pgflow.environment = \'local\'')
    fresh = db.connect()
    assert fresh.execute("SELECT pgflow.is_local()").fetchone()[0] is True
    fresh.execute(f'ALTER DATABASE "{db.name}" SET pgflow.environment = \'production\'')
    assert db.connect().execute("SELECT pgflow.is_local()").fetchone()[0] is False


def test_compile_rejects_bad_shapes_without_side_effects(rt):
    with raises_sqlstate("PF003", "steps"):
        compile_(rt, "badshape", {"nosteps": True})
    with raises_sqlstate("PF003", "unknown step"):
        compile_(rt, "badshape", shape({"slug": "b", "dependencies": ["a"]}))
    assert rt.val("SELECT count(*) FROM pgflow.flows") == 0


def test_delete_flow_and_data_removes_everything(rt):
    rt.flow("doomed", [{"slug": "a"}, {"slug": "each", "step_type": "map", "deps": ["a"]}])
    rt.flow("survivor", [{"slug": "a"}])
    for _ in range(3):
        rt.start("doomed", {})
    keep = rt.start("survivor", {})
    rt.poll("doomed", qty=1)
    rt.conn.execute("SELECT pgflow.delete_flow_and_data('doomed')")
    for table in ("flows", "steps", "deps", "runs", "step_states", "step_tasks"):
        assert rt.val(f"SELECT count(*) FROM pgflow.{table} WHERE flow_slug = 'doomed'") == 0, table
    assert rt.val("SELECT count(*) FROM pgmq.meta WHERE queue_name = 'doomed'") == 0
    assert rt.val("SELECT to_regclass('pgmq.q_doomed')") is None
    assert rt.val("SELECT to_regclass('pgmq.a_doomed')") is None
    assert rt.run(keep)["status"] == "started"
    assert len(rt.messages("survivor")) == 1
    # deleting a flow that does not exist is a no-op
    rt.conn.execute("SELECT pgflow.delete_flow_and_data('doomed')")


def test_delete_flow_and_data_waits_for_a_worker_holding_task_rows(rt, db):
    """Lock order: the deletion waits for a worker's task locks, and never deadlocks with it."""
    rt.flow("busyflow", [{"slug": "a"}])
    run = rt.start("busyflow", {})
    [t] = rt.poll("busyflow")
    worker = db.connect(autocommit=False)
    worker.execute("SELECT * FROM pgflow.complete_task(%s, 'a', 0, '1')", (run,))  # holds run/task/queue locks
    deleter = db.connect()
    done = commit_when_blocked(rt.conn, worker, deleter,
                               lambda: deleter.execute("SELECT pgflow.delete_flow_and_data('busyflow')"))
    assert worker.info.backend_pid in done["blockers"]
    assert "value" in done, done.get("error")
    assert rt.val("SELECT count(*) FROM pgflow.flows") == 0
    assert rt.val("SELECT to_regclass('pgmq.q_busyflow')") is None


@pytest.mark.baseline_only(
    reason="case aliases cannot exist from 0003 on (create_flow refuses them with PF003); deleting a legacy "
    "camelCase flow is tests/stage1/test_deletion.py::test_delete_drops_a_legacy_camelcase_queue_by_its_listed_spelling"
)
def test_delete_keeps_a_queue_shared_with_a_case_alias(rt):
    """0.14.1 hazard: MyFlow and myflow share pgmq.q_myflow; deleting one must not break the other."""
    rt.flow("MyFlow", [{"slug": "a"}])
    rt.flow("myflow", [{"slug": "a"}])
    run_a = rt.start("MyFlow", {})
    run_b = rt.start("myflow", {})
    rt.conn.execute("SELECT pgflow.delete_flow_and_data('MyFlow')")
    assert rt.val("SELECT to_regclass('pgmq.q_myflow')") is not None
    remaining = rt.messages("myflow")
    assert [m["message"]["run_id"] for m in remaining] == [str(run_b)]
    assert rt.run(run_a) is None
    [t] = rt.poll("myflow")
    rt.complete(run_b, "a", 0, 1)
    assert rt.run(run_b)["status"] == "completed"

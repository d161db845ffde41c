"""DAG execution through real SQL: linear, diamond, fan-in, maps (root, dependent, empty), type violations."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from tests.runtime.driver import raises_sqlstate


def test_linear_flow_passes_outputs_down_and_completes(rt):
    rt.flow("linear", [{"slug": "a"}, {"slug": "b", "deps": ["a"]}, {"slug": "c", "deps": ["b"]}])
    run = rt.start("linear", {"n": 1})
    assert rt.statuses(run) == {"a": "started", "b": "created", "c": "created"}

    [a] = rt.poll("linear")
    assert (a["step_slug"], a["input"], a["flow_input"]) == ("a", {}, {"n": 1})
    rt.complete(run, "a", 0, {"a": 1})

    [b] = rt.poll("linear")
    assert (b["step_slug"], b["input"], b["flow_input"]) == ("b", {"a": {"a": 1}}, None)
    rt.complete(run, "b", 0, {"b": 2})

    [c] = rt.poll("linear")
    assert c["input"] == {"b": {"b": 2}}
    rt.complete(run, "c", 0, "done")

    run_row = rt.run(run)
    assert run_row["status"] == "completed"
    assert run_row["output"] == {"c": "done"}  # only the leaf
    assert run_row["remaining_steps"] == 0
    assert [t["status"] for t in rt.tasks(run)] == ["completed"] * 3
    assert rt.messages("linear") == []
    assert len(rt.archived("linear")) == 3


def test_diamond_waits_for_both_branches(rt):
    rt.flow("diamond", [
        {"slug": "root"},
        {"slug": "left", "deps": ["root"]},
        {"slug": "right", "deps": ["root"]},
        {"slug": "join", "deps": ["left", "right"]},
    ])
    run = rt.start("diamond", {})
    [root] = rt.poll("diamond")
    rt.complete(run, "root", 0, 10)

    branches = rt.poll("diamond")
    assert sorted(t["step_slug"] for t in branches) == ["left", "right"]
    assert all(t["input"] == {"root": 10} for t in branches)

    rt.complete(run, "left", 0, "L")
    assert rt.statuses(run)["join"] == "created"
    assert rt.steps(run)["join"]["remaining_deps"] == 1
    assert rt.poll("diamond") == []

    rt.complete(run, "right", 0, "R")
    [join] = rt.poll("diamond")
    assert join["input"] == {"left": "L", "right": "R"}
    rt.complete(run, "join", 0, "LR")
    assert rt.run(run)["output"] == {"join": "LR"}


def test_fan_in_starts_all_roots_at_once(rt):
    rt.flow("fanin", [
        {"slug": "r1"}, {"slug": "r2"}, {"slug": "r3"},
        {"slug": "sink", "deps": ["r3", "r1", "r2"]},
    ])
    run = rt.start("fanin", {"k": "v"})
    roots = rt.poll("fanin")
    assert sorted(t["step_slug"] for t in roots) == ["r1", "r2", "r3"]
    assert all(t["flow_input"] == {"k": "v"} for t in roots)
    for t in roots:
        rt.complete(run, t["step_slug"], 0, t["step_slug"].upper())
    [sink] = rt.poll("fanin")
    assert sink["input"] == {"r1": "R1", "r2": "R2", "r3": "R3"}
    assert rt.steps(run)["sink"]["remaining_deps"] == 0
    rt.complete(run, "sink", 0, None)
    assert rt.run(run)["status"] == "completed"


def test_root_map_one_task_per_element_and_ordered_output(rt):
    rt.flow("rootmap", [{"slug": "each", "step_type": "map"}, {"slug": "after", "deps": ["each"]}])
    run = rt.start("rootmap", ["a", "b", "c"])
    assert rt.steps(run)["each"]["initial_tasks"] == 3

    tasks = rt.poll("rootmap")
    assert sorted((t["task_index"], t["input"]) for t in tasks) == [(0, "a"), (1, "b"), (2, "c")]
    assert all(t["flow_input"] is None for t in tasks)
    # message body names exactly its task
    for m in rt.messages("rootmap"):
        assert m["message"]["step_slug"] == "each"
    by_msg = {t["msg_id"]: t["task_index"] for t in tasks}
    for row in rt.tasks(run, "each"):
        assert by_msg[row["message_id"]] == row["task_index"]

    # complete out of order: the aggregated output follows task_index
    for index in (2, 0, 1):
        rt.complete(run, "each", index, f"out{index}")
    assert rt.steps(run)["each"]["output"] == ["out0", "out1", "out2"]
    [after] = rt.poll("rootmap")
    assert after["input"] == {"each": ["out0", "out1", "out2"]}
    rt.complete(run, "after", 0, "ok")
    assert rt.run(run)["status"] == "completed"


def test_root_map_requires_array_input(rt):
    rt.flow("needsarray", [{"slug": "each", "step_type": "map"}])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="must be a JSON array"):
        rt.start("needsarray", {"not": "array"})
    assert rt.val("SELECT count(*) FROM pgflow.runs") == 0


def test_map_over_dependency_output_then_map_of_map(rt):
    rt.flow("depmap", [
        {"slug": "produce"},
        {"slug": "double", "deps": ["produce"], "step_type": "map"},
        {"slug": "inc", "deps": ["double"], "step_type": "map"},
        {"slug": "total", "deps": ["inc"]},
    ])
    run = rt.start("depmap", {})
    assert rt.steps(run)["double"]["initial_tasks"] is None  # unknown until produce completes
    [p] = rt.poll("depmap")
    rt.complete(run, "produce", 0, [1, 2, 3, 4])
    assert rt.steps(run)["double"]["initial_tasks"] == 4

    doubles = rt.poll("depmap")
    assert sorted((t["task_index"], t["input"]) for t in doubles) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    for t in doubles:
        rt.complete(run, "double", t["task_index"], t["input"] * 2)
    assert rt.steps(run)["inc"]["initial_tasks"] == 4

    incs = rt.poll("depmap")
    assert sorted(t["input"] for t in incs) == [2, 4, 6, 8]
    for t in incs:
        rt.complete(run, "inc", t["task_index"], t["input"] + 1)
    [total] = rt.poll("depmap")
    assert total["input"] == {"inc": [3, 5, 7, 9]}
    rt.complete(run, "total", 0, 24)
    assert rt.run(run)["output"] == {"total": 24}


def test_empty_root_map_completes_without_tasks_and_releases_children(rt):
    rt.flow("emptyroot", [
        {"slug": "each", "step_type": "map"},
        {"slug": "again", "deps": ["each"], "step_type": "map"},
        {"slug": "after", "deps": ["again"]},
    ])
    run = rt.start("emptyroot", [])
    states = rt.steps(run)
    assert states["each"]["status"] == "completed" and states["each"]["output"] == []
    assert states["again"]["status"] == "completed" and states["again"]["output"] == []
    assert states["after"]["status"] == "started"
    assert rt.tasks(run, "each") == [] and rt.tasks(run, "again") == []
    [after] = rt.poll("emptyroot")
    assert after["input"] == {"again": []}
    rt.complete(run, "after", 0, "nothing to do")
    assert rt.run(run)["status"] == "completed"


def test_empty_map_only_flow_completes_inside_start_flow(rt):
    rt.flow("onlyempty", [{"slug": "each", "step_type": "map"}])
    run = rt.start("onlyempty", [])
    row = rt.run(run)
    assert row["status"] == "completed"
    assert row["output"] == {"each": []}
    assert rt.messages("onlyempty") == []


def test_dependent_map_over_empty_array(rt):
    rt.flow("depempty", [
        {"slug": "produce"},
        {"slug": "each", "deps": ["produce"], "step_type": "map"},
    ])
    run = rt.start("depempty", {})
    rt.poll("depempty")
    rt.complete(run, "produce", 0, [])
    states = rt.steps(run)
    assert states["each"]["status"] == "completed"
    assert states["each"]["initial_tasks"] == 0
    assert states["each"]["output"] == []
    assert rt.run(run)["status"] == "completed"
    assert rt.run(run)["output"] == {"each": []}


def test_type_violation_fails_run_and_cancels_the_rest(rt):
    rt.flow("typeviol", [
        {"slug": "produce"},
        {"slug": "side"},
        {"slug": "each", "deps": ["produce"], "step_type": "map"},
    ])
    run = rt.start("typeviol", {})
    claimed = rt.poll("typeviol")
    assert sorted(t["step_slug"] for t in claimed) == ["produce", "side"]
    rt.complete(run, "produce", 0, {"not": "an array"})

    assert rt.run(run)["status"] == "failed"
    produce = rt.task(run, "produce")
    assert produce["status"] == "failed"
    assert produce["error_message"].startswith("[TYPE_VIOLATION]")
    assert rt.steps(run)["produce"]["status"] == "failed"
    assert rt.task(run, "side")["status"] == "cancelled"
    assert rt.messages("typeviol") == []

    # the side task's worker reports late: nothing revives
    late = rt.complete(run, "side", 0, "late")
    assert late["status"] == "cancelled"
    assert rt.run(run)["status"] == "failed"


def test_flow_without_steps_completes_immediately(rt):
    rt.flow("nosteps")
    run = rt.start("nosteps", {})
    assert rt.run(run)["status"] == "completed"
    assert rt.run(run)["output"] == {}


def test_start_flow_unknown_flow_is_pf006(rt):
    with raises_sqlstate("PF006", 'flow "ghost" does not exist'):
        rt.start("ghost", {})


def test_start_flow_with_explicit_run_id_and_states_document(rt):
    rt.flow("states", [{"slug": "a"}, {"slug": "b", "deps": ["a"]}])
    run_id = uuid.uuid4()
    doc = rt.val("SELECT pgflow.start_flow_with_states('states', '{\"x\": 1}', %s)", (run_id,))
    assert doc["run"]["run_id"] == str(run_id)
    assert doc["run"]["status"] == "started"
    assert [s["step_slug"] for s in doc["steps"]] == ["a", "b"]
    assert [s["status"] for s in doc["steps"]] == ["started", "created"]
    again = rt.val("SELECT pgflow.get_run_with_states(%s)", (run_id,))
    assert again["run"]["run_id"] == str(run_id)
    with raises_sqlstate("PF006"):
        rt.val("SELECT pgflow.get_run_with_states(%s)", (uuid.uuid4(),))


def test_drive_many_runs_to_completion(rt):
    """Several concurrent runs of one flow, handled in batches like a worker would."""
    rt.flow("busy", [
        {"slug": "split"},
        {"slug": "work", "deps": ["split"], "step_type": "map"},
        {"slug": "sum", "deps": ["work"]},
    ])
    runs = [rt.start("busy", {"n": n}) for n in range(1, 6)]

    def handler(task):
        if task["step_slug"] == "split":
            return list(range(task["flow_input"]["n"]))
        if task["step_slug"] == "work":
            return task["input"] * 10
        return sum(task["input"]["work"])

    rt.drive("busy", handler)
    for n, run in enumerate(runs, start=1):
        row = rt.run(run)
        assert row["status"] == "completed"
        assert row["output"] == {"sum": sum(i * 10 for i in range(n))}

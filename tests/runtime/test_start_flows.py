"""``pgflow.start_flows(flow_slug, inputs)`` (the queue stage, 0003): one run per element, in array order,
each as ``start_flow`` would start it (docs/runtime.md "Starting many runs")."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.types.json import Jsonb

pytestmark = pytest.mark.upgraded_only(reason="start_flows exists from the queue stage (0003) on")


def _start_flows(rt, slug: str, inputs) -> list[dict]:
    return rt.rows("SELECT * FROM pgflow.start_flows(%s, %s)", (slug, Jsonb(inputs)))


def _shape(rt, run_id) -> dict:
    """A run's rows without ids and times."""
    run = rt.run(run_id)
    return {
        "run": (run["status"], run["remaining_steps"], run["input"], run["output"]),
        "steps": sorted((s["step_slug"], s["status"], s["remaining_deps"], s["remaining_tasks"], s["initial_tasks"],
                         s["output"], s["skip_reason"]) for s in rt.steps(run_id).values()),
        "tasks": [(t["step_slug"], t["task_index"], t["status"], t["message_id"] is not None) for t in rt.tasks(run_id)],
    }


FLOWS = {
    "plain": [{"slug": "a"}, {"slug": "b", "deps": ["a"]}, {"slug": "late", "start_delay": 30}],
    "mapped": [{"slug": "items", "step_type": "map"}, {"slug": "sum", "deps": ["items"]}],
    "guarded": [{"slug": "only_big", "required_input_pattern": {"big": True}, "when_unmet": "skip"},
                {"slug": "next", "deps": ["only_big"]}],
}
INPUTS = {
    "plain": [{"n": 1}, {"n": 2}, {"n": 3}],
    "mapped": [[1, 2], [], [3]],  # the empty map completes at once and releases its child
    "guarded": [{"big": True}, {"big": False}],
}


@pytest.mark.parametrize("slug", sorted(FLOWS))
def test_each_run_is_what_start_flow_makes_of_it(rt, slug):
    rt.flow(slug, FLOWS[slug])
    started = _start_flows(rt, slug, INPUTS[slug])
    assert [r["input"] for r in started] == INPUTS[slug]  # array order
    singles = [rt.start(slug, value) for value in INPUTS[slug]]
    assert [_shape(rt, r["run_id"]) for r in started] == [_shape(rt, r) for r in singles]
    assert [r["status"] for r in started] == [rt.run(r["run_id"])["status"] for r in started]
    # every live message names its own run's task
    bodies = {(m["message"]["run_id"], m["message"]["step_slug"]) for m in rt.messages(rt.queue(slug))}
    for run in started:
        for task in rt.tasks(run["run_id"]):
            if task["status"] == "queued":
                assert (str(run["run_id"]), task["step_slug"]) in bodies


def test_start_delays_apply_per_run(rt):
    rt.flow("plain", FLOWS["plain"])
    runs = _start_flows(rt, "plain", [{}, {}])
    late = [t for r in runs for t in rt.tasks(r["run_id"], "late")]
    assert len(late) == 2
    for task in late:
        assert rt.vt_in("plain", task["message_id"]) > 25


def test_a_bad_element_is_named_and_nothing_starts(rt):
    rt.flow("mapped", FLOWS["mapped"])
    bad_element = r'start_flows\(\): element 1: flow "mapped" has a root map step, so its input must be a JSON array \(got object\)'
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=bad_element):
        _start_flows(rt, "mapped", [[1], {"not": "an array"}])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"inputs must be a JSON array of run inputs \(got object\)"):
        _start_flows(rt, "mapped", {"n": 1})
    with pytest.raises(psycopg.Error, match=r'start_flows\(\): flow "nope" does not exist') as unknown:
        _start_flows(rt, "nope", [{}])
    assert unknown.value.sqlstate == "PF006"
    assert rt.val("SELECT count(*) FROM pgflow.runs") == 0
    assert _start_flows(rt, "mapped", []) == []


def _sent_order(rt, runs: list) -> list[tuple]:
    """The runs' tasks in message_id order (the order their messages were sent): (run, step, index)."""
    order = {r: i for i, r in enumerate(runs)}
    rows = rt.rows("SELECT run_id, step_slug, task_index FROM pgflow.step_tasks WHERE run_id = ANY (%s) "
                   "ORDER BY message_id", (runs,))
    return [(order[r["run_id"]], r["step_slug"], r["task_index"]) for r in rows]


def test_runs_of_a_plain_flow_start_their_root_steps_together_as_start_flow_would(rt):
    """0014: the root steps share a queue and a start delay, so every run's messages go out in one
    send (no start_ready_steps call per run), with the same rows and the same message order as one
    start_flow per element."""
    rt.flow("roots", [{"slug": "b"}, {"slug": "a"}, {"slug": "c", "deps": ["a", "b"]}])
    inputs = [{"n": i} for i in range(4)]
    with rt.conn.transaction():
        rt.conn.execute("SET LOCAL track_functions = 'all'")
        count = "SELECT coalesce(pg_stat_get_xact_function_calls('pgflow.start_ready_steps(uuid)'::regprocedure), 0) AS n"
        before = rt.val(count)
        started = [r["run_id"] for r in _start_flows(rt, "roots", inputs)]
        assert rt.val(count) == before  # started together
    singles = [rt.start("roots", value) for value in inputs]
    assert [_shape(rt, r) for r in started] == [_shape(rt, r) for r in singles]
    assert _sent_order(rt, started) == _sent_order(rt, singles) == [(i, s, 0) for i in range(4) for s in ("a", "b")]

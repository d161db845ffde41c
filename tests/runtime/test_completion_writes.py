"""What a worker's completion writes (the queue stage, 0003): each step state and run changes once
per transition (a batch of several tasks of one map step counts its state down once), so
PostgreSQL never re-checks their foreign keys for a second update of a row the transaction already
changed (docs/runtime.md "What each call does, and what it skips").

The counts come from the server's own per-transaction statistics
(``pg_stat_get_xact_tuples_updated``); the end states are the runtime's usual ones, and
tests/runtime/test_batch_reports.py compares single calls with batches row by row.
"""

from __future__ import annotations

import pytest
from psycopg.types.json import Jsonb

from tests.runtime.test_batch_reports import _element

pytestmark = pytest.mark.upgraded_only(reason="the worker progression of the queue stage (0003)")

UPDATED = "SELECT pg_stat_get_xact_tuples_updated(%s::regclass) AS n"


def _updates(rt, report) -> dict[str, int]:
    """Rows updated per table by ``report()``, inside one transaction."""
    tables = ("pgflow.step_states", "pgflow.step_tasks", "pgflow.runs")
    with rt.conn.transaction():
        before = {t: rt.val(UPDATED, (t,)) for t in tables}
        report()
        return {t.removeprefix("pgflow."): rt.val(UPDATED, (t,)) - before[t] for t in tables}


def test_a_single_step_completes_with_one_update_of_its_state(rt):
    rt.flow("chain", [{"slug": "a"}, {"slug": "b", "deps": ["a"]}])
    run = rt.start("chain", {})
    (task,) = rt.poll("chain")
    written = _updates(rt, lambda: rt.complete(run, "a", task["task_index"], {"x": 1}))
    # a: started -> completed in one row version; b: released, then started
    assert written == {"step_states": 3, "step_tasks": 1, "runs": 1}
    assert rt.statuses(run) == {"a": "completed", "b": "started"}
    assert rt.steps(run)["a"]["output"] == {"x": 1}
    assert rt.steps(run)["a"]["remaining_tasks"] == 0


def test_a_map_task_that_is_not_the_last_only_counts_down(rt):
    rt.flow("fan", [{"slug": "m", "step_type": "map"}, {"slug": "z", "deps": ["m"]}])
    run = rt.start("fan", [1, 2, 3])
    tasks = sorted(rt.poll("fan"), key=lambda t: t["task_index"])
    written = _updates(rt, lambda: rt.complete(run, "m", 2, 30))
    assert written == {"step_states": 1, "step_tasks": 1, "runs": 0}
    assert rt.steps(run)["m"]["remaining_tasks"] == 2 and rt.steps(run)["m"]["status"] == "started"
    rt.complete(run, "m", 0, 10)
    written = _updates(rt, lambda: rt.complete(run, "m", 1, 20))
    # the last task: m completes with its outputs in task_index order, z is released and started
    assert written == {"step_states": 3, "step_tasks": 1, "runs": 1}
    assert rt.steps(run)["m"]["output"] == [10, 20, 30]
    assert rt.statuses(run) == {"m": "completed", "z": "started"}
    assert len(tasks) == 3


def test_the_last_step_completes_the_run(rt):
    rt.flow("one", [{"slug": "only"}])
    run = rt.start("one", {})
    (task,) = rt.poll("one")
    written = _updates(rt, lambda: rt.complete(run, "only", task["task_index"], "done"))
    # the step once; the run once (one step less and completed in the same row version)
    assert written == {"step_states": 1, "step_tasks": 1, "runs": 1}
    assert rt.run(run)["status"] == "completed" and rt.run(run)["output"] == {"only": "done"}


def test_a_batch_writes_each_run_and_each_map_step_state_once(rt):
    rt.flow("ones", [{"slug": "only"}])
    runs = [rt.start("ones", {"n": i}) for i in range(3)]
    tasks = {t["run_id"]: t for t in rt.poll("ones")}
    report = Jsonb([_element(tasks[r], f"done{i}") for i, r in enumerate(runs)])
    written = _updates(rt, lambda: rt.rows("SELECT * FROM pgflow.complete_tasks(%s)", (report,)))
    # every run's last step: each run is written once, completed with its output
    assert written == {"step_states": 3, "step_tasks": 3, "runs": 3}
    assert [(rt.run(r)["status"], rt.run(r)["output"]) for r in runs] == [
        ("completed", {"only": f"done{i}"}) for i in range(3)]

    rt.flow("fan_batch", [{"slug": "m", "step_type": "map"}, {"slug": "z", "deps": ["m"]}])
    run = rt.start("fan_batch", list(range(5)))
    tasks = {t["task_index"]: t for t in rt.poll("fan_batch")}
    report = Jsonb([_element(tasks[i], i * 10) for i in (3, 0, 4)])
    written = _updates(rt, lambda: rt.rows("SELECT * FROM pgflow.complete_tasks(%s)", (report,)))
    # three tasks of one map step: its state counted down once, by three
    assert written == {"step_states": 1, "step_tasks": 3, "runs": 0}
    assert rt.steps(run)["m"]["remaining_tasks"] == 2
    report = Jsonb([_element(tasks[i], i * 10) for i in (2, 1)])
    written = _updates(rt, lambda: rt.rows("SELECT * FROM pgflow.complete_tasks(%s)", (report,)))
    # the last two: m completes once, z is released and started, the run has one step less
    assert written == {"step_states": 3, "step_tasks": 2, "runs": 1}
    assert rt.steps(run)["m"]["output"] == [0, 10, 20, 30, 40]
    assert rt.statuses(run) == {"m": "completed", "z": "started"}


SET_WRITES = "pgflow._write_task_completions(uuid[], text[], integer[], jsonb[], text)"
CALLS = "SELECT coalesce(pg_stat_get_xact_function_calls(%s::regprocedure), 0) AS n"


def _set_writes(rt, report) -> int:
    """How often ``report()`` ran the set-based writes (whose planner settings are saved and
    restored on every call), inside one transaction."""
    with rt.conn.transaction():
        rt.conn.execute("SET LOCAL track_functions = 'all'")
        before = rt.val(CALLS, (SET_WRITES,))
        report()
        return rt.val(CALLS, (SET_WRITES,)) - before


def test_one_element_is_written_by_the_core_and_only_a_batch_of_several_by_the_set_based_writes(rt):
    rt.flow("pairs", [{"slug": "a"}, {"slug": "b", "deps": ["a"]}])
    runs = [rt.start("pairs", {"n": i}) for i in range(4)]
    tasks = {t["run_id"]: t for t in rt.poll("pairs")}

    def batch(*picked: tuple) -> None:
        rt.rows("SELECT * FROM pgflow.complete_tasks(%s)", (Jsonb([_element(tasks[r], v) for r, v in picked]),))

    assert _set_writes(rt, lambda: rt.complete(runs[0], "a", 0, "single")) == 0
    assert _set_writes(rt, lambda: batch((runs[1], "batch of one"))) == 0
    assert _set_writes(rt, lambda: batch((runs[2], "x"), (runs[3], "y"))) == 1
    assert [rt.steps(r)["a"]["output"] for r in runs] == ["single", "batch of one", "x", "y"]
    assert {rt.statuses(r)["b"] for r in runs} == {"started"}

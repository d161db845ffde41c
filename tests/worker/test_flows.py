"""DAG shapes and map steps run to completion through the reference Worker on the real server.

Handler inputs follow docs/runtime.md "What a task receives" as the worker presents them
(pgflow_cli/worker/flow.py): a root single step gets the run input, a dependent single step
``{dep: output}`` of its completed dependencies, a map step one element of its array.
"""

from __future__ import annotations

from pgflow_cli.worker import Flow
from tests.worker.helpers import wait_until


def _completed_once(env, run_id: str, expected_steps: dict[str, int]) -> None:
    """Every task of the run completed on its first attempt; task counts per step as expected."""
    tasks = env.tasks(run_id)
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t["step_slug"]] = counts.get(t["step_slug"], 0) + 1
        assert (t["status"], t["attempts_count"]) == ("completed", 1), t
    assert counts == {k: v for k, v in expected_steps.items() if v}
    assert sorted(env.recorder.keys()) == sorted((run_id, t["step_slug"], t["task_index"]) for t in tasks)
    assert env.recorder.duplicates() == {}


def test_linear_flow_passes_outputs_down_the_chain(env):
    rec = env.recorder
    flow = (
        Flow("linearFlow")
        .step("first", rec.wrap(lambda run_input, ctx: {"name": run_input["name"].upper()}))
        .step("second", rec.wrap(lambda deps, ctx: f"hello {deps['first']['name']}"), depends_on=["first"])
        .step("third", rec.wrap(lambda deps, ctx: len(deps["second"])), depends_on=["second"])
    )
    worker = env.start_worker(flow)
    run_id = env.start_run("linearFlow", {"name": "ada"})
    [run] = env.wait_runs_finished([run_id])

    assert run["status"] == "completed"
    assert run["output"] == {"third": len("hello ADA")}
    inputs = {c.step_slug: c.input for c in rec.calls}
    assert inputs == {"first": {"name": "ada"}, "second": {"first": {"name": "ADA"}}, "third": {"second": "hello ADA"}}
    assert {c.worker_id for c in rec.calls} == {worker.worker_id}
    _completed_once(env, run_id, {"first": 1, "second": 1, "third": 1})
    steps = env.steps(run_id)
    assert {s: v["output"] for s, v in steps.items()} == {"first": {"name": "ADA"}, "second": "hello ADA", "third": 9}
    assert all(t["last_worker_id"] is not None and str(t["last_worker_id"]) == worker.worker_id for t in env.tasks(run_id))


def test_diamond_flow_joins_both_branches(env):
    rec = env.recorder
    flow = (
        Flow("diamondFlow")
        .step("root", rec.wrap(lambda run_input, ctx: run_input["x"]))
        .step("left", rec.wrap(lambda deps, ctx: deps["root"] + 1), depends_on=["root"])
        .step("right", rec.wrap(lambda deps, ctx: deps["root"] * 10), depends_on=["root"])
        .step("join", rec.wrap(lambda deps, ctx: deps), depends_on=["left", "right"])
    )
    env.start_worker(flow, max_concurrent=4)
    runs = [env.start_run("diamondFlow", {"x": x}) for x in (1, 2, 3)]
    finished = env.wait_runs_finished(runs)

    assert {str(r["run_id"]): r["status"] for r in finished} == {r: "completed" for r in runs}
    for x, run_id in zip((1, 2, 3), runs, strict=True):
        assert env.run(run_id)["output"] == {"join": {"left": x + 1, "right": x * 10}}
        by_step = {c.step_slug: c.input for c in rec.calls if c.run_id == run_id}
        assert by_step == {
            "root": {"x": x},
            "left": {"root": x},
            "right": {"root": x},
            "join": {"left": x + 1, "right": x * 10},
        }
    for run_id in runs:
        _completed_once_subset(env, run_id)


def _completed_once_subset(env, run_id: str) -> None:
    tasks = env.tasks(run_id)
    assert tasks and all((t["status"], t["attempts_count"]) == ("completed", 1) for t in tasks), tasks
    mine = sorted(k for k in env.recorder.keys() if k[0] == run_id)  # noqa: SIM118 (a Recorder method, not a dict)
    assert mine == sorted((run_id, t["step_slug"], t["task_index"]) for t in tasks)


def test_fan_in_waits_for_every_root(env):
    rec = env.recorder
    flow = (
        Flow("fanInFlow")
        .step("alpha", rec.wrap(lambda run_input, ctx: f"a{run_input['n']}"))
        .step("beta", rec.wrap(lambda run_input, ctx: f"b{run_input['n']}"))
        .step("gamma", rec.wrap(lambda run_input, ctx: f"c{run_input['n']}"))
        .step("gather", rec.wrap(lambda deps, ctx: sorted(deps.items())), depends_on=["alpha", "beta", "gamma"])
    )
    env.start_worker(flow, max_concurrent=3)
    run_id = env.start_run("fanInFlow", {"n": 7})
    [run] = env.wait_runs_finished([run_id])

    assert run["status"] == "completed"
    assert run["output"] == {"gather": [["alpha", "a7"], ["beta", "b7"], ["gamma", "c7"]]}
    roots = {c.step_slug: c.input for c in rec.calls if c.step_slug != "gather"}
    assert roots == {"alpha": {"n": 7}, "beta": {"n": 7}, "gamma": {"n": 7}}
    [gather] = rec.for_step("gather")
    assert gather.input == {"alpha": "a7", "beta": "b7", "gamma": "c7"}
    # gather was handed out only after all three roots completed
    tasks = {t["step_slug"]: t for t in env.tasks(run_id)}
    assert tasks["gather"]["started_at"] >= max(tasks[s]["completed_at"] for s in ("alpha", "beta", "gamma"))
    _completed_once(env, run_id, {"alpha": 1, "beta": 1, "gamma": 1, "gather": 1})


def test_root_map_output_is_in_task_index_order_whatever_the_finish_order(env):
    """Element 0 is held until element 2 has completed in the database; the map output is still
    ordered by task_index, and each handler received exactly its element."""
    rec = env.recorder

    def square(item, ctx):
        if ctx.task_index == 0:
            # hold the first element until the last one is recorded as completed
            wait_until(lambda: _task_status(env.db, ctx.run_id, "square", 2) == "completed",
                       "element 2 to complete first")
        return item * item

    flow = (
        Flow("rootMapFlow")
        .map("square", rec.wrap(square))
        .step("total", rec.wrap(lambda deps, ctx: sum(deps["square"])), depends_on=["square"])
    )
    env.start_worker(flow, max_concurrent=3, batch_size=3)
    run_id = env.start_run("rootMapFlow", [3, 4, 5])
    [run] = env.wait_runs_finished([run_id])

    assert run["status"] == "completed"
    assert run["output"] == {"total": 50}
    assert env.steps(run_id)["square"]["output"] == [9, 16, 25]
    assert sorted((c.task_index, c.input) for c in rec.for_step("square")) == [(0, 3), (1, 4), (2, 5)]
    [total] = rec.for_step("total")
    assert total.input == {"square": [9, 16, 25]}
    squares = {t["task_index"]: t for t in env.tasks(run_id, "square")}
    assert squares[2]["completed_at"] < squares[0]["completed_at"]  # finished out of order
    assert [squares[i]["output"] for i in range(3)] == [9, 16, 25]
    _completed_once(env, run_id, {"square": 3, "total": 1})


def _task_status(db, run_id, step, index):
    with db.connect() as conn:
        row = conn.execute("SELECT status FROM pgflow.step_tasks WHERE run_id = %s AND step_slug = %s AND task_index = %s",
                           (run_id, step, index)).fetchone()
    return row[0] if row else None


def test_map_over_a_dependency_output(env):
    rec = env.recorder
    flow = (
        Flow("depMapFlow")
        .step("split", rec.wrap(lambda run_input, ctx: run_input["text"].split()))
        .map("measure", rec.wrap(lambda word, ctx: {"word": word, "len": len(word)}), array="split")
        .step("report", rec.wrap(lambda deps, ctx: [m["len"] for m in deps["measure"]]), depends_on=["measure"])
    )
    env.start_worker(flow, max_concurrent=4)
    run_id = env.start_run("depMapFlow", {"text": "the quick brown fox"})
    [run] = env.wait_runs_finished([run_id])

    assert run["status"] == "completed"
    assert run["output"] == {"report": [3, 5, 5, 3]}
    assert sorted((c.task_index, c.input) for c in rec.for_step("measure")) == [
        (0, "the"), (1, "quick"), (2, "brown"), (3, "fox")]
    assert env.steps(run_id)["measure"]["initial_tasks"] == 4
    [report] = rec.for_step("report")
    assert report.input == {"measure": [{"word": w, "len": len(w)} for w in ("the", "quick", "brown", "fox")]}
    _completed_once(env, run_id, {"split": 1, "measure": 4, "report": 1})


def test_empty_arrays_complete_maps_without_any_task(env):
    rec = env.recorder
    root_map = (
        Flow("emptyRootMap")
        .map("each", rec.wrap(lambda item, ctx: item))
        .step("after", rec.wrap(lambda deps, ctx: {"got": deps["each"]}), depends_on=["each"])
    )
    dep_map = (
        Flow("emptyDepMap")
        .step("list", rec.wrap(lambda run_input, ctx: []))
        .map("each", rec.wrap(lambda item, ctx: item), array="list")
        .step("after", rec.wrap(lambda deps, ctx: {"got": deps["each"]}), depends_on=["each"])
    )
    env.start_worker(root_map)
    env.start_worker(dep_map)
    root_run = env.start_run("emptyRootMap", [])
    dep_run = env.start_run("emptyDepMap", {})
    env.wait_runs_finished([root_run, dep_run])

    for run_id in (root_run, dep_run):
        run = env.run(run_id)
        assert run["status"] == "completed"
        assert run["output"] == {"after": {"got": []}}
        each = env.steps(run_id)["each"]
        assert (each["status"], each["initial_tasks"], each["output"]) == ("completed", 0, [])
        assert env.tasks(run_id, "each") == []
    assert rec.for_step("each") == []  # no handler call for an empty map
    assert [c.input for c in rec.for_step("after")] == [{"each": []}, {"each": []}]
    assert [c.step_slug for c in rec.calls if c.run_id == dep_run] == ["list", "after"]

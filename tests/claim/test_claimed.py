"""Decision-table row "queued task of this exact route, eligible -> claimed".

The claim counts one attempt, records the worker, sets the message's visibility to the task's
effective timeout (step, else flow) + 2 s and hands over the handler input the runtime builds
for root, dependent and map tasks.
"""

from __future__ import annotations

from datetime import timedelta

from tests.claim.helpers import ClaimEnv


def _shapes(cl: ClaimEnv) -> None:
    # first (single, own timeout) -> after (single); first -> each (map over first's output);
    # items: a root map over the run input.
    cl.flow("shapes", [
        {"slug": "first", "timeout": 7},
        {"slug": "items", "step_type": "map"},
        {"slug": "after", "deps": ["first"]},
        {"slug": "each", "deps": ["first"], "step_type": "map", "timeout": 11},
    ], timeout=45)


def _assert_vt(cl: ClaimEnv, result, queue: str, msg_id: int, seconds: int) -> None:
    """vt = clock at claim time + seconds: bounded by the clock read before and after the call."""
    vt = cl.message(queue, msg_id)["vt"]
    assert result.before + timedelta(seconds=seconds) <= vt <= result.after + timedelta(seconds=seconds)


def test_root_single_and_root_map_tasks_are_claimed_with_their_inputs(cl):
    _shapes(cl)
    run = cl.start("shapes", [10, 20, 30])
    worker = cl.worker("shapes")
    ids = cl.read("shapes")
    assert len(ids) == 4

    result = cl.claim("shapes", ids, worker, "shapes")

    assert [r["message_id"] for r in result.rows] == sorted(ids)
    assert {r["outcome"] for r in result.rows} == {"claimed"}
    assert all(r["reason"] is None for r in result.rows)
    got = {(r["step_slug"], r["task_index"]): r for r in result.rows}
    assert set(got) == {("first", 0), ("items", 0), ("items", 1), ("items", 2)}
    # a root single step gets {} as input and the run input as flow_input
    assert (got["first", 0]["input"], got["first", 0]["flow_input"]) == ({}, [10, 20, 30])
    # a root map task gets its element of the run input, no flow_input
    for index, value in enumerate([10, 20, 30]):
        assert (got["items", index]["input"], got["items", index]["flow_input"]) == (value, None)

    for (step, index), row in got.items():
        task = cl.task(run, step, index)
        assert row["message_id"] == task["message_id"]
        assert (row["flow_slug"], row["run_id"]) == ("shapes", run)
        assert task["status"] == "started"
        assert task["attempts_count"] == 1
        assert task["last_worker_id"] == worker
        assert task["started_at"] is not None
        # effective timeout: the step's own (7) or the flow's (45), plus 2 s
        _assert_vt(cl, result, "shapes", row["message_id"], 9 if step == "first" else 47)
    assert result.notices == []


def test_dependent_single_and_dependent_map_tasks_get_their_dependency_outputs(cl):
    _shapes(cl)
    run = cl.start("shapes", [1])
    worker = cl.worker("shapes")
    first = cl.claim("shapes", cl.read("shapes"), worker, "shapes")
    for r in first.claimed:
        cl.complete(run, r["step_slug"], r["task_index"], ["a", "b"] if r["step_slug"] == "first" else r["input"])

    ids = cl.read("shapes")
    result = cl.claim("shapes", ids, worker, "shapes")

    got = {(r["step_slug"], r["task_index"]): r for r in result.rows}
    assert {r["outcome"] for r in result.rows} == {"claimed"}
    assert set(got) == {("after", 0), ("each", 0), ("each", 1)}
    # a dependent single step gets {dependency: output}, no flow_input
    assert (got["after", 0]["input"], got["after", 0]["flow_input"]) == ({"first": ["a", "b"]}, None)
    # a dependent map task gets its element of the dependency's output
    assert [got["each", i]["input"] for i in (0, 1)] == ["a", "b"]
    assert [got["each", i]["flow_input"] for i in (0, 1)] == [None, None]
    _assert_vt(cl, result, "shapes", got["after", 0]["message_id"], 47)
    _assert_vt(cl, result, "shapes", got["each", 1]["message_id"], 13)
    for (step, index) in got:
        task = cl.task(run, step, index)
        assert (task["status"], task["attempts_count"], task["last_worker_id"]) == ("started", 1, worker)


def test_a_retried_task_is_claimed_again_with_its_next_attempt(cl):
    cl.flow("retry", [{"slug": "a"}], max_attempts=3, base_delay=0)
    run = cl.start("retry", {"x": 1})
    worker = cl.worker("retry")
    cl.claim("retry", cl.read("retry"), worker, "retry")
    cl.fail(run, "a", 0)
    assert cl.task(run, "a")["status"] == "queued"

    [msg] = cl.read("retry")
    other = cl.worker("retry")
    result = cl.claim("retry", [msg], other, "retry")

    assert result.outcomes == {msg: ("claimed", None)}
    task = cl.task(run, "a")
    assert (task["status"], task["attempts_count"], task["last_worker_id"]) == ("started", 2, other)


def test_repeated_and_null_ids_are_judged_once(cl):
    cl.flow("repeat", [{"slug": "a"}])
    cl.start("repeat", {})
    worker = cl.worker("repeat")
    [msg] = cl.read("repeat")

    result = cl.conn.execute(
        "SELECT * FROM pgflow.claim_tasks('repeat', ARRAY[%s, NULL, %s]::bigint[], %s, 'repeat')", (msg, msg, worker)
    ).fetchall()
    cl.record_rows(result)

    assert [(r["message_id"], r["outcome"]) for r in result] == [(msg, "claimed")]


def test_an_empty_batch_changes_nothing(cl):
    cl.flow("empty", [{"slug": "a"}])
    cl.start("empty", {})
    worker = cl.worker("empty")
    before = cl.snapshot()
    assert cl.claim("empty", [], worker, "empty").rows == []
    assert cl.rows("SELECT * FROM pgflow.claim_tasks('empty', NULL, %s, 'empty')", (worker,)) == []
    assert cl.snapshot() == before


def test_one_batch_of_root_map_tasks_from_several_runs_gets_each_run_s_elements(cl):
    """From 0012 a claim reads each run's input once per call and picks the task's element from it:
    tasks of several runs (inputs of different sizes, one batch, ids interleaved) must each still
    get the element of their own run's input, and a single root step beside them its flow input."""
    cl.flow("maps", [{"slug": "items", "step_type": "map"}, {"slug": "solo"}])
    inputs = [[f"a{i}" for i in range(3)], list(range(100, 105)), [{"k": 1}, None]]
    runs = [cl.start("maps", value) for value in inputs]
    worker = cl.worker("maps")
    ids = cl.read("maps", qty=20)
    assert len(ids) == 3 + 5 + 2 + 3

    result = cl.claim("maps", ids, worker, "maps")

    assert {r["outcome"] for r in result.rows} == {"claimed"}
    got = {(r["run_id"], r["step_slug"], r["task_index"]): (r["input"], r["flow_input"]) for r in result.rows}
    expected = {(run, "items", i): (element, None) for run, value in zip(runs, inputs, strict=True) for i, element in enumerate(value)}
    expected |= {(run, "solo", 0): ({}, value) for run, value in zip(runs, inputs, strict=True)}
    assert got == expected


def test_one_batch_of_dependent_map_tasks_from_several_runs_and_maps_gets_each_run_s_elements(cl):
    """From 0015 a claim reads each dependency output a map's tasks index into once per call (one
    per run and map step): tasks of two dependent maps of two runs, claimed in one batch, must each
    get the element of their own run's dependency output."""
    cl.flow("fans", [{"slug": "lists"}, {"slug": "words"},
                     {"slug": "each", "deps": ["lists"], "step_type": "map"},
                     {"slug": "spell", "deps": ["words"], "step_type": "map"}])
    worker = cl.worker("fans")
    outputs = {}
    for n in (2, 3):
        run = cl.start("fans", {"n": n})
        outputs[run] = {"lists": list(range(10 * n, 11 * n)), "words": [f"w{n}-{i}" for i in range(n + 1)]}
    roots = cl.claim("fans", cl.read("fans", qty=10), worker, "fans")
    assert len(roots.claimed) == 4
    for row in roots.claimed:
        cl.complete(row["run_id"], row["step_slug"], 0, outputs[row["run_id"]][row["step_slug"]])
    ids = cl.read("fans", qty=30)

    result = cl.claim("fans", ids, worker, "fans")

    assert {r["outcome"] for r in result.rows} == {"claimed"}
    got = {(r["run_id"], r["step_slug"], r["task_index"]): (r["input"], r["flow_input"]) for r in result.rows}
    source = {"each": "lists", "spell": "words"}
    assert got == {(run, step, i): (element, None) for run, out in outputs.items() for step, dep in source.items()
                   for i, element in enumerate(out[dep])}

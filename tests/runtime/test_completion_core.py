"""Every completion goes through one core (``pgflow._complete_started_tasks``) and every final failure
through one failure core (``pgflow._fail_started_task``), whichever entry point reports it. What the
other runtime tests leave out:

* the realtime events of a batch report are those of one single call per element, in array order
  (with ``realtime.send`` present a batch of several elements goes element by element: each
  element's events come between the others');
* a [TYPE_VIOLATION] fails the run whatever the producing step's ``when_exhausted`` says (no later
  step could use the output), from a single report, a one-element batch and a batch of several.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.runtime.driver import realtime_events
from tests.runtime.test_batch_reports import _element
from tests.runtime.test_optional import _fake_realtime

pytestmark = pytest.mark.upgraded_only(reason="complete_tasks exists from the queue stage on")

def test_a_batch_sends_the_events_of_one_call_per_element_in_array_order(rt):
    _fake_realtime(rt)
    shape = [{"slug": "a"}, {"slug": "m", "deps": ["a"], "step_type": "map"}, {"slug": "z", "deps": ["m"]},
             {"slug": "typed"}, {"slug": "each", "deps": ["typed"], "step_type": "map"}]
    sides: dict[bool, dict[str, Any]] = {}
    for batch in (False, True):
        slug = f"{'batched' if batch else 'single'}_{uuid.uuid4().hex[:6]}"
        rt.flow(slug, shape)
        sides[batch] = {"slug": slug, "runs": [rt.start(slug, {"n": i}) for i in range(3)], "pool": []}

    def report(picks: list[tuple[int, str, int, Any]]) -> None:
        for batch, side in sides.items():
            side["pool"].extend(rt.poll(side["slug"]))
            tasks = []
            for r, step, index, value in picks:
                task = next(t for t in side["pool"] if t["run_id"] == side["runs"][r]
                            and t["step_slug"] == step and t["task_index"] == index)
                tasks.append((task, value))
            if batch:
                rt.rows("SELECT * FROM pgflow.complete_tasks(%s)", (Jsonb([_element(t, v) for t, v in tasks]),))
            else:
                for t, v in tasks:
                    rt.complete(t["run_id"], t["step_slug"], t["task_index"], v)

    # independent elements of three runs (run 2's map gets no item: it completes at once and its z
    # starts); then two tasks of run 0's map (the last one completes it) around run 1's typed step,
    # which breaks the type rule and fails its run, so run 1's map task is reported late
    report([(0, "a", 0, [1, 2]), (1, "a", 0, [3]), (2, "a", 0, [])])
    report([(0, "m", 1, "m0.1"), (1, "typed", 0, {"not": "an array"}), (0, "m", 0, "m0.0"), (1, "m", 0, "m1.0")])
    report([(0, "z", 0, "z0"), (2, "typed", 0, ["x"]), (0, "typed", 0, [])])

    single, batched = (realtime_events(rt, sides[b]["runs"]) for b in (False, True))
    assert batched == single
    assert next(p for r, e, p in batched if (r, e) == (0, "step:m:completed"))["output"] == ["m0.0", "m0.1"]
    assert [e for r, e, _ in batched if r == 1][-2:] == ["step:typed:failed", "run:failed"]
    assert [rt.run(r)["status"] for r in sides[True]["runs"]] == ["completed", "failed", "started"]


@pytest.mark.parametrize("when_exhausted", ["skip", "skip-cascade"])
@pytest.mark.parametrize("report", ["single", "batch of one", "batch of two"])
def test_a_type_violation_fails_the_run_whatever_when_exhausted_says(rt, when_exhausted, report):
    slug = f"typed_{uuid.uuid4().hex[:6]}"
    rt.flow(slug, [{"slug": "produce", "when_exhausted": when_exhausted, "max_attempts": 1},
                   {"slug": "each", "deps": ["produce"], "step_type": "map"}, {"slug": "other"}])
    run, bystander = rt.start(slug, {}), rt.start(slug, {})
    claimed = {(t["run_id"], t["step_slug"]): t for t in rt.poll(slug)}
    if report == "single":
        rt.complete(run, "produce", 0, {"not": "an array"})
    else:
        # with another run's report beside it, the batch goes element by element
        tasks = [(claimed[run, "produce"], {"not": "an array"})]
        tasks += [(claimed[bystander, "other"], "o")] if report == "batch of two" else []
        rt.rows("SELECT * FROM pgflow.complete_tasks(%s)", (Jsonb([_element(t, v) for t, v in tasks]),))

    task = rt.task(run, "produce")
    assert (task["status"], task["output"]) == ("failed", {"not": "an array"})
    assert task["error_message"] == ('[TYPE_VIOLATION] step "produce" returned object, but map step(s) "each" need a '
                                     'JSON array from it')
    assert rt.statuses(run)["produce"] == "failed"
    assert rt.steps(run)["produce"]["error_message"] == task["error_message"]
    assert rt.run(run)["status"] == "failed"
    assert rt.task(run, "other")["status"] == "cancelled"
    assert rt.task(bystander, "other")["status"] == ("completed" if report == "batch of two" else "started")
    assert rt.statuses(bystander)["produce"] == "started"

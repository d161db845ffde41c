"""Retry, resume and cancel of runs (docs/runtime.md "Retry, resume, cancel"), on real servers.

Resume reuses every task its source completed, map elements included, and queues only the others;
conditions and taskless steps are decided again as on a fresh run. Retry is a fresh run of the same
input. Both name their source in ``restart_of_run_id`` and leave it unchanged. Cancel ends a run
failed with its reason; late worker reports are refused and counted. Every test ends with the
runtime invariants (tests/support/invariants.py).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.runtime.driver import raises_sqlstate


def _source(rt, run_id: uuid.UUID) -> dict[str, Any]:
    """Everything of a run that a restart must leave as it is."""
    return {"run": rt.run(run_id), "steps": rt.steps(run_id), "tasks": rt.tasks(run_id)}


def _resume(rt, run_id: uuid.UUID) -> uuid.UUID:
    return rt.one("SELECT * FROM pgflow.resume_run(%s)", (run_id,))["run_id"]


def _retry(rt, run_id: uuid.UUID) -> uuid.UUID:
    return rt.one("SELECT * FROM pgflow.retry_run(%s)", (run_id,))["run_id"]


def _manual(rt, flow: str, step: str) -> None:
    """Make ``step`` a manual step (what startup compilation does for ``manual=True``)."""
    rt.conn.execute("SELECT pgflow._set_step_manual(%s, %s)", (flow, step))


def _queued(rt, run_id: uuid.UUID) -> list[tuple[str, int]]:
    return [(t["step_slug"], t["task_index"]) for t in rt.tasks(run_id) if t["status"] == "queued"]


def _messages_of(rt, queue: str, run_id: uuid.UUID) -> list[tuple[str, int]]:
    return sorted((m["message"]["step_slug"], m["message"]["task_index"]) for m in rt.messages(queue)
                  if m["message"]["run_id"] == str(run_id))


def _fail_run_at(rt, slug: str, failing: set[tuple[str, int]]) -> None:
    """Drive the flow's queue until nothing is visible: of each claim, every task not in ``failing``
    completes first (with ``{"step", "i", "in"}``), then the ``failing`` ones fail."""
    for _ in range(50):
        claimed = rt.poll(slug)
        if not claimed:
            return
        key = lambda task: (task["step_slug"], task["task_index"])  # noqa: E731
        for task in sorted(claimed, key=lambda task: key(task) in failing):
            if key(task) in failing:
                rt.fail(task["run_id"], task["step_slug"], task["task_index"], f"{key(task)} broke")
            else:
                rt.complete(task["run_id"], task["step_slug"], task["task_index"],
                            {"step": task["step_slug"], "i": task["task_index"], "in": task["input"]})
    raise AssertionError(f"flow {slug} still had work after 50 rounds")


def test_resume_of_a_map_with_one_failed_element_queues_exactly_that_element(rt):
    rt.flow("tenmap", [{"slug": "each", "step_type": "map"}, {"slug": "total", "deps": ["each"]}],
            max_attempts=1, base_delay=0)
    source = rt.start("tenmap", list(range(10)))
    _fail_run_at(rt, "tenmap", {("each", 6)})
    assert rt.run(source)["status"] == "failed"
    assert [t["status"] for t in rt.tasks(source, "each")].count("completed") == 9
    before = _source(rt, source)

    resumed = _resume(rt, source)

    run = rt.run(resumed)
    assert (run["status"], run["restart_of_run_id"], run["restart_kind"], run["input"]) == (
        "started", source, "resume", list(range(10)))
    assert _queued(rt, resumed) == [("each", 6)]
    assert _messages_of(rt, rt.queue("tenmap"), resumed) == [("each", 6)]
    reused = {t["task_index"]: t for t in rt.tasks(resumed, "each") if t["status"] == "completed"}
    assert sorted(reused) == [0, 1, 2, 3, 4, 5, 7, 8, 9]
    assert all(t["attempts_count"] == 0 and t["message_id"] is None for t in reused.values())
    assert {i: t["output"] for i, t in reused.items()} == {
        t["task_index"]: t["output"] for t in before["tasks"] if t["step_slug"] == "each" and t["status"] == "completed"}
    assert rt.steps(resumed)["each"]["remaining_tasks"] == 1
    assert _source(rt, source) == before

    _fail_run_at(rt, "tenmap", set())
    done = rt.run(resumed)
    assert done["status"] == "completed"
    outputs = rt.steps(resumed)["each"]["output"]
    assert [o["i"] for o in outputs] == list(range(10))  # the map output in task_index order
    assert outputs[6]["in"] == 6


DIAMOND = [{"slug": "root"}, {"slug": "left", "deps": ["root"]}, {"slug": "right", "deps": ["root"]},
           {"slug": "join", "deps": ["left", "right"]}, {"slug": "after", "deps": ["join"]}]


def test_resume_of_a_diamond_runs_only_the_failed_branch_and_its_dependents(rt):
    rt.flow("diamond", DIAMOND, max_attempts=1, base_delay=0)
    source = rt.start("diamond", {"n": 1})
    _fail_run_at(rt, "diamond", {("right", 0)})
    assert rt.statuses(source) == {"root": "completed", "left": "completed", "right": "failed",
                                   "join": "created", "after": "created"}
    before = _source(rt, source)

    resumed = _resume(rt, source)
    assert _queued(rt, resumed) == [("right", 0)]
    assert rt.statuses(resumed) == {"root": "completed", "left": "completed", "right": "started",
                                    "join": "created", "after": "created"}
    handled = [(t["step_slug"], t["task_index"]) for t in rt.drive("diamond", lambda task: {"ok": task["step_slug"]})]
    assert handled == [("right", 0), ("join", 0), ("after", 0)]
    assert rt.run(resumed)["status"] == "completed"
    assert rt.task(resumed, "root")["attempts_count"] == 0
    assert rt.task(resumed, "left")["output"] == rt.task(source, "left")["output"]
    assert _source(rt, source) == before


def test_resume_decides_conditions_and_empty_maps_again_as_a_fresh_run(rt):
    # gate is skipped by its condition, empty is an empty map (taskless), both as on a fresh run;
    # work completes in the source and is reused; last fails in the source
    rt.flow("conds", [
        {"slug": "work"},
        {"slug": "gate", "deps": ["work"], "required_input_pattern": {"work": {"go": True}}, "when_unmet": "skip"},
        {"slug": "list", "deps": ["work"]},
        {"slug": "empty", "deps": ["list"], "step_type": "map"},
        {"slug": "last", "deps": ["empty", "gate"]},
    ], max_attempts=1, base_delay=0)
    source = rt.start("conds", {})

    def handler(task: dict) -> Any:
        if task["step_slug"] == "last" and rt.run(task["run_id"])["restart_of_run_id"] is None:
            raise RuntimeError("last broke")
        return {"list": [], "work": {"go": False}}.get(task["step_slug"], {"done": task["step_slug"]})
    rt.drive("conds", handler)
    fresh_states = rt.statuses(source)
    assert fresh_states == {"work": "completed", "gate": "skipped", "list": "completed", "empty": "completed",
                            "last": "failed"}

    resumed = _resume(rt, source)
    assert rt.statuses(resumed) == {**fresh_states, "last": "started"}
    assert rt.steps(resumed)["gate"]["skip_reason"] == "condition_unmet"
    assert rt.steps(resumed)["empty"]["output"] == []
    assert _queued(rt, resumed) == [("last", 0)]
    rt.drive("conds", handler)
    assert rt.run(resumed)["status"] == "completed"


def test_resume_runs_a_step_again_when_its_dependency_ended_otherwise(rt):
    # "soft" fails with when_exhausted=skip in the source, so "uses" ran without it; on resume soft
    # succeeds, so uses' input differs and its source output must not be reused
    rt.flow("soft", [{"slug": "soft", "when_exhausted": "skip"}, {"slug": "uses", "deps": ["soft"]},
                     {"slug": "breaks", "deps": ["uses"]}], max_attempts=1, base_delay=0)
    source = rt.start("soft", {})
    attempts = {"n": 0}

    def handler(task: dict) -> Any:
        if task["step_slug"] == "soft" and attempts["n"] == 0:
            attempts["n"] += 1
            raise RuntimeError("soft broke")
        if task["step_slug"] == "breaks" and rt.run(task["run_id"])["restart_of_run_id"] is None:
            raise RuntimeError("breaks broke")
        return {"saw": sorted(task["input"])}
    rt.drive("soft", handler)
    assert rt.statuses(source) == {"soft": "skipped", "uses": "completed", "breaks": "failed"}

    resumed = _resume(rt, source)
    assert _queued(rt, resumed) == [("soft", 0)]
    rt.drive("soft", handler)
    assert rt.run(resumed)["status"] == "completed"
    assert rt.task(resumed, "uses")["attempts_count"] == 1
    assert rt.task(resumed, "uses")["output"] == {"saw": ["soft"]}


def test_retry_is_a_fresh_run_of_the_same_input_and_leaves_the_source_as_it_was(rt):
    rt.flow("again", DIAMOND, max_attempts=1, base_delay=0)
    source = rt.start("again", {"n": 7})
    _fail_run_at(rt, "again", {("left", 0)})
    before = _source(rt, source)

    retried = _retry(rt, source)
    run = rt.run(retried)
    assert (run["status"], run["input"], run["restart_of_run_id"], run["restart_kind"]) == (
        "started", {"n": 7}, source, "retry")
    assert retried != source
    assert _queued(rt, retried) == [("root", 0)]
    rt.drive("again", lambda task: {"ok": True})
    assert rt.run(retried)["status"] == "completed"
    assert all(t["attempts_count"] == 1 for t in rt.tasks(retried))
    assert _source(rt, source) == before

    again = _retry(rt, source)  # a failed run may be retried again: each retry names it
    assert rt.run(again)["restart_of_run_id"] == source


@pytest.mark.parametrize("operation", ["retry_run", "resume_run"])
def test_only_a_failed_run_can_be_restarted(rt, operation):
    rt.flow("busy", [{"slug": "a"}], max_attempts=1, base_delay=0)
    started = rt.start("busy", {})
    with raises_sqlstate("PF013", "only a failed"):
        rt.one(f"SELECT * FROM pgflow.{operation}(%s)", (started,))
    rt.drive("busy", lambda task: 1)
    with raises_sqlstate("PF013", "is completed"):
        rt.one(f"SELECT * FROM pgflow.{operation}(%s)", (started,))
    with raises_sqlstate("PF006", "does not exist"):
        rt.one(f"SELECT * FROM pgflow.{operation}(%s)", (uuid.uuid4(),))


def test_cancel_ends_the_run_failed_with_its_reason_and_terminalizes_every_task(rt):
    rt.flow("stop", [{"slug": "each", "step_type": "map"}, {"slug": "ok"}, {"slug": "later", "deps": ["each"]}],
            max_attempts=2, base_delay=0)
    _manual(rt, "stop", "ok")
    run_id = rt.start("stop", [1, 2, 3])
    claimed = rt.poll("stop")[:1]  # one task started, two queued, a manual task waiting
    assert rt.statuses(run_id)["ok"] == "started"

    assert rt.one("SELECT * FROM pgflow.cancel_run(%s, %s)", (run_id, "wrong input"))["status"] == "failed"
    run = rt.run(run_id)  # with its cancel record, kept beside it in pgflow.run_cancellations
    assert (run["status"], run["cancel_reason"]) == ("failed", "wrong input")
    assert run["cancelled_at"] == run["failed_at"] and run["cancelled_by"]
    assert {t["status"] for t in rt.tasks(run_id)} == {"cancelled"}
    assert rt.statuses(run_id) == {"each": "failed", "ok": "failed", "later": "created"}
    assert rt.steps(run_id)["each"]["error_message"] == "[CANCELLED] wrong input"
    assert _messages_of(rt, rt.queue("stop"), run_id) == []

    # the started handler reports late: refused (the task stays cancelled) and counted
    late = rt.complete(run_id, claimed[0]["step_slug"], claimed[0]["task_index"], {"late": True})
    assert (late["status"], late["refused_reports"], late["output"]) == ("cancelled", 1, None)
    again = rt.fail(run_id, claimed[0]["step_slug"], claimed[0]["task_index"])
    assert (again["status"], again["refused_reports"]) == ("cancelled", 2)
    with raises_sqlstate("PF011"):
        rt.one("SELECT * FROM pgflow.complete_manual_task(%s, 'ok', 0, %s)", (run_id, Jsonb({"yes": 1})))

    # a second cancel changes nothing; a completed run cannot be cancelled
    assert rt.one("SELECT * FROM pgflow.cancel_run(%s, 'other')", (run_id,))["status"] == "failed"
    assert rt.run(run_id)["cancel_reason"] == "wrong input"
    rt.flow("done", [{"slug": "a"}])
    finished = rt.start("done", {})
    rt.drive("done", lambda task: 1)
    with raises_sqlstate("PF013", "already completed"):
        rt.one("SELECT * FROM pgflow.cancel_run(%s)", (finished,))

    # a cancelled run can be resumed: the map elements run again, the manual task waits again
    resumed = _resume(rt, run_id)
    assert sorted(_queued(rt, resumed)) == [("each", 0), ("each", 1), ("each", 2)]
    assert rt.task(resumed, "ok")["status"] == "started"


def test_resume_reuses_completed_manual_tasks(rt):
    rt.flow("approve", [{"slug": "ok"}, {"slug": "go", "deps": ["ok"]}], max_attempts=1, base_delay=0)
    _manual(rt, "approve", "ok")
    source = rt.start("approve", {})
    rt.one("SELECT * FROM pgflow.complete_manual_task(%s, 'ok', 0, %s)", (source, Jsonb({"yes": 1})))
    rt.drive("approve", lambda task: (_ for _ in ()).throw(RuntimeError("no")))
    assert rt.run(source)["status"] == "failed"
    resumed = _resume(rt, source)
    assert rt.task(resumed, "ok")["status"] == "completed"
    assert rt.task(resumed, "ok")["output"] == {"yes": 1}
    assert _queued(rt, resumed) == [("go", 0)]


def test_a_resume_of_a_resume_reuses_the_reused_tasks_too(rt):
    rt.flow("chain", [{"slug": "each", "step_type": "map"}], max_attempts=1, base_delay=0)
    first = rt.start("chain", [1, 2, 3])
    _fail_run_at(rt, "chain", {("each", 1), ("each", 2)})  # element 1 fails; 2 is cancelled or failed too
    second = _resume(rt, first)
    _fail_run_at(rt, "chain", {("each", 2)})
    assert rt.run(second)["status"] == "failed"
    third = _resume(rt, second)
    assert rt.run(third)["restart_of_run_id"] == second
    assert _queued(rt, third) == [("each", 2)]
    assert [t["task_index"] for t in rt.tasks(third, "each") if t["status"] == "completed"] == [0, 1]
    _fail_run_at(rt, "chain", set())
    assert rt.run(third)["status"] == "completed"


def test_a_run_cancelled_while_only_a_manual_task_waits_resumes_with_nothing_queued(rt):
    rt.flow("late", [{"slug": "a"}, {"slug": "gate", "deps": ["a"]}], max_attempts=1, base_delay=0)
    _manual(rt, "late", "gate")
    source = rt.start("late", {})
    _fail_run_at(rt, "late", set())
    rt.one("SELECT * FROM pgflow.complete_manual_task(%s, 'gate', 0, %s)", (source, Jsonb({"ok": True})))
    assert rt.run(source)["status"] == "completed"
    # a second run, cancelled while its manual step waits; its only queue-backed task completed
    other = rt.start("late", {})
    _fail_run_at(rt, "late", set())
    rt.one("SELECT * FROM pgflow.cancel_run(%s)", (other,))
    resumed = rt.one("SELECT * FROM pgflow.resume_run(%s)", (other,))
    assert (resumed["status"], rt.statuses(resumed["run_id"])) == ("started", {"a": "completed", "gate": "started"})
    assert _messages_of(rt, rt.queue("late"), resumed["run_id"]) == []

"""Failures: retry backoff read from the queue's vt, exhaustion by when_exhausted, late calls."""

from __future__ import annotations

import pytest

TOLERANCE = 1.5


def test_calculate_retry_delay(rt):
    values = rt.rows(
        "SELECT pgflow.calculate_retry_delay(b, a) AS d FROM (VALUES (5, 1), (5, 2), (5, 3), (0, 4), (1.5, 1), (2, 0)) v(b, a)"
    )
    assert [v["d"] for v in values] == [10, 20, 40, 0, 3, 2]


def test_retry_backoff_doubles_and_third_failure_is_terminal(rt):
    """create_flow defaults: 3 attempts, base delay 5 -> retries after 10 s and 20 s."""
    rt.flow("backoff", [{"slug": "flaky"}])
    flow = rt.one("SELECT * FROM pgflow.flows WHERE flow_slug = 'backoff'")
    assert (flow["opt_max_attempts"], flow["opt_base_delay"], flow["opt_timeout"]) == (3, 5, 60)
    run = rt.start("backoff", {})

    [task] = rt.poll("backoff")
    msg_id = task["msg_id"]
    rt.fail(run, "flaky", 0, "first")
    row = rt.task(run, "flaky")
    assert (row["status"], row["attempts_count"], row["error_message"]) == ("queued", 1, "first")
    assert row["started_at"] is None
    assert rt.vt_in("backoff", msg_id) == pytest.approx(10, abs=TOLERANCE)
    assert rt.read("backoff") == []  # not visible yet

    rt.make_visible("backoff")
    [again] = rt.poll("backoff")
    assert again["msg_id"] == msg_id  # the message keeps its id across retries
    rt.fail(run, "flaky", 0, "second")
    assert rt.task(run, "flaky")["attempts_count"] == 2
    assert rt.vt_in("backoff", msg_id) == pytest.approx(20, abs=TOLERANCE)

    rt.make_visible("backoff")
    rt.poll("backoff")
    rt.fail(run, "flaky", 0, "third")
    row = rt.task(run, "flaky")
    assert (row["status"], row["attempts_count"], row["error_message"]) == ("failed", 3, "third")
    assert rt.steps(run)["flaky"]["status"] == "failed"
    assert rt.steps(run)["flaky"]["error_message"] == "third"
    assert rt.run(run)["status"] == "failed"
    assert rt.messages("backoff") == []
    assert [m["msg_id"] for m in rt.archived("backoff")] == [msg_id]


def test_step_options_override_flow_options(rt):
    rt.flow("override", [{"slug": "s", "max_attempts": 2, "base_delay": 3}], max_attempts=5, base_delay=100)
    run = rt.start("override", {})
    [t] = rt.poll("override")
    rt.fail(run, "s", 0)
    assert rt.vt_in("override", t["msg_id"]) == pytest.approx(6, abs=TOLERANCE)
    rt.make_visible("override")
    rt.poll("override")
    rt.fail(run, "s", 0)
    assert rt.task(run, "s")["status"] == "failed"  # 2 attempts, not 5


def test_exhausted_fail_cancels_every_other_unfinished_task(rt):
    rt.flow("failrun", [
        {"slug": "each", "step_type": "map"},
        {"slug": "other"},
        {"slug": "never", "deps": ["other"]},
    ], max_attempts=1)
    run = rt.start("failrun", [1, 2, 3])
    claimed = rt.poll("failrun", qty=2)  # two of the four messages are claimed, two stay queued
    assert len(claimed) == 2
    culprit = next(t for t in claimed if t["step_slug"] == "each")
    rt.fail(run, "each", culprit["task_index"], "broken")

    assert rt.run(run)["status"] == "failed"
    assert rt.run(run)["failed_at"] is not None
    tasks = {(t["step_slug"], t["task_index"]): t["status"] for t in rt.tasks(run)}
    assert tasks.pop(("each", culprit["task_index"])) == "failed"
    assert set(tasks.values()) == {"cancelled"}
    assert len(tasks) == 3
    assert rt.statuses(run)["each"] == "failed"
    assert rt.statuses(run)["never"] == "created"  # never started, no task
    assert rt.messages("failrun") == []


def test_exhausted_skip_skips_siblings_and_lets_children_run(rt):
    rt.flow("skipstep", [
        {"slug": "each", "step_type": "map", "when_exhausted": "skip", "max_attempts": 1},
        {"slug": "keep"},
        {"slug": "child", "deps": ["each", "keep"]},
        {"slug": "mapchild", "deps": ["each"], "step_type": "map"},
    ])
    run = rt.start("skipstep", [1, 2, 3])
    claimed = rt.poll("skipstep")
    rt.complete(run, "each", 0, "done0")
    rt.fail(run, "each", 1, "bad element")

    states = rt.steps(run)
    assert states["each"]["status"] == "skipped"
    assert states["each"]["skip_reason"] == "handler_failed"
    assert states["each"]["error_message"] == "bad element"
    each_tasks = [t["status"] for t in rt.tasks(run, "each")]
    assert each_tasks == ["completed", "failed", "skipped"]
    # the map child of the skipped map gets zero tasks and completes with []
    assert states["mapchild"]["status"] == "completed"
    assert states["mapchild"]["output"] == []
    assert rt.run(run)["status"] == "started"

    keep = next(t for t in claimed if t["step_slug"] == "keep")
    rt.complete(run, "keep", keep["task_index"], "K")
    [child] = rt.poll("skipstep")
    assert child["input"] == {"keep": "K"}  # skipped dependency is left out
    rt.complete(run, "child", 0, "C")
    run_row = rt.run(run)
    assert run_row["status"] == "completed"
    assert run_row["output"] == {"child": "C", "mapchild": []}

    # a late report from the skipped sibling changes nothing
    late = rt.complete(run, "each", 2, "late")
    assert late["status"] == "skipped"
    assert rt.steps(run)["each"]["status"] == "skipped"


def test_exhausted_skip_cascade_skips_descendants_only(rt):
    rt.flow("cascade", [
        {"slug": "bad", "when_exhausted": "skip-cascade", "max_attempts": 1},
        {"slug": "good"},
        {"slug": "under", "deps": ["bad"]},
        {"slug": "deeper", "deps": ["under", "good"]},
        {"slug": "beside", "deps": ["good"]},
    ])
    run = rt.start("cascade", {})
    rt.poll("cascade")
    rt.fail(run, "bad", 0, "nope")
    states = rt.steps(run)
    assert (states["bad"]["status"], states["bad"]["skip_reason"]) == ("skipped", "handler_failed")
    assert states["bad"]["error_message"] == "nope"
    assert (states["under"]["status"], states["under"]["skip_reason"]) == ("skipped", "dependency_skipped")
    assert (states["deeper"]["status"], states["deeper"]["skip_reason"]) == ("skipped", "dependency_skipped")
    assert rt.task(run, "bad")["status"] == "failed"
    assert rt.run(run)["remaining_steps"] == 2  # good, beside

    rt.complete(run, "good", 0, "G")
    [beside] = rt.poll("cascade")
    rt.complete(run, "beside", 0, "B")
    run_row = rt.run(run)
    assert run_row["status"] == "completed"
    assert run_row["output"] == {"beside": "B"}  # skipped leaf "deeper" left out


def test_skip_cascade_of_started_map_skips_its_queued_and_started_tasks(rt):
    rt.flow("cascmap", [
        {"slug": "each", "step_type": "map", "when_exhausted": "skip-cascade", "max_attempts": 1},
        {"slug": "after", "deps": ["each"]},
    ])
    run = rt.start("cascmap", [1, 2, 3, 4])
    claimed = rt.poll("cascmap", qty=2)
    rt.fail(run, "each", claimed[0]["task_index"], "x")
    statuses = sorted(t["status"] for t in rt.tasks(run, "each"))
    assert statuses == ["failed", "skipped", "skipped", "skipped"]
    assert rt.statuses(run) == {"each": "skipped", "after": "skipped"}
    assert rt.run(run)["status"] == "completed"
    assert rt.messages("cascmap") == []


def test_late_calls_after_run_failed_never_revive(rt):
    rt.flow("late", [{"slug": "a"}, {"slug": "b"}], max_attempts=1)
    run = rt.start("late", {})
    rt.poll("late")
    rt.fail(run, "a", 0, "dead")
    assert rt.task(run, "b")["status"] == "cancelled"

    assert rt.complete(run, "b", 0, "too late")["status"] == "cancelled"
    assert rt.fail(run, "b", 0, "also late")["status"] == "cancelled"
    assert rt.fail(run, "a", 0, "again")["status"] == "failed"
    assert rt.run(run)["status"] == "failed"
    assert rt.statuses(run)["b"] == "started"  # upstream keeps the other step states as they were
    assert rt.task(run, "b")["output"] is None
    assert rt.messages("late") == []


def test_late_complete_on_completed_task_is_idempotent(rt):
    rt.flow("twice", [{"slug": "a"}, {"slug": "b", "deps": ["a"]}])
    run = rt.start("twice", {})
    rt.poll("twice")
    rt.complete(run, "a", 0, 1)
    assert rt.complete(run, "a", 0, 2)["output"] == 1
    assert rt.steps(run)["b"]["remaining_deps"] == 0
    assert rt.run(run)["remaining_steps"] == 1


def test_unknown_run_or_task_returns_nothing(rt):
    import uuid

    assert rt.complete(uuid.uuid4(), "a", 0, 1) is None
    assert rt.fail(uuid.uuid4(), "a", 0) is None
    rt.flow("exists", [{"slug": "a"}])
    run = rt.start("exists", {})
    assert rt.complete(run, "a", 7, 1) is None


def test_retry_without_a_message_is_treated_as_exhausted(rt):
    """A task whose message is gone cannot be retried (it would sit queued forever)."""
    rt.flow("nomsg", [{"slug": "a"}])
    run = rt.start("nomsg", {})
    [t] = rt.poll("nomsg")
    rt.conn.execute("SELECT pgmq.archive('nomsg', %s::bigint)", (t["msg_id"],))
    rt.fail(run, "a", 0, "oops")
    row = rt.task(run, "a")
    assert row["status"] == "failed"
    assert "not retried" in row["error_message"]
    assert rt.run(run)["status"] == "failed"

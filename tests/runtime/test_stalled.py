"""Stalled recovery: effective timeout + 30 s, requeue limit, terminal runs/steps never requeued.

Instead of sleeping, tests move started_at backwards (the clock rule is what is tested).
"""

from __future__ import annotations

import pytest

TOLERANCE = 1.5


def _age(rt, run, step, seconds, index=0):
    rt.conn.execute(
        "UPDATE pgflow.step_tasks SET started_at = now() - make_interval(secs => %s), "
        "queued_at = least(queued_at, now() - make_interval(secs => %s)) "
        "WHERE run_id = %s AND step_slug = %s AND task_index = %s",
        (seconds, seconds, run, step, index),
    )


def _requeue(rt) -> int:
    return rt.val("SELECT pgflow.requeue_stalled_tasks()")


def test_stalled_uses_effective_step_timeout_plus_30(rt):
    rt.flow("stall", [{"slug": "short", "timeout": 5}, {"slug": "flowwide"}], timeout=60)
    run = rt.start("stall", {})
    rt.poll("stall")
    _age(rt, run, "short", 34)
    _age(rt, run, "flowwide", 89)
    assert _requeue(rt) == 0  # 34 < 5 + 30, 89 < 60 + 30

    _age(rt, run, "short", 36)
    assert _requeue(rt) == 1
    short = rt.task(run, "short")
    assert (short["status"], short["requeued_count"], short["started_at"], short["last_worker_id"]) == ("queued", 1, None, None)
    assert short["last_requeued_at"] is not None
    assert short["attempts_count"] == 1  # not reset: the next claim uses another attempt
    assert rt.vt_in("stall", short["message_id"]) <= 0.1  # visible now
    assert rt.task(run, "flowwide")["status"] == "started"

    _age(rt, run, "flowwide", 91)
    assert _requeue(rt) == 1
    assert rt.task(run, "flowwide")["status"] == "queued"

    # requeued tasks are claimable again
    again = rt.poll("stall")
    assert sorted(t["step_slug"] for t in again) == ["flowwide", "short"]
    assert rt.task(run, "short")["attempts_count"] == 2


def test_requeue_limit_marks_task_permanently_stalled(rt):
    rt.flow("stuck", [{"slug": "a", "timeout": 1}, {"slug": "b", "deps": ["a"]}], max_attempts=10)
    run = rt.start("stuck", {})
    msg_id = rt.task(run, "a")["message_id"]
    for expected_requeues in (1, 2, 3):
        [t] = rt.poll("stuck")
        assert t["msg_id"] == msg_id
        _age(rt, run, "a", 40)
        assert _requeue(rt) == 1
        assert rt.task(run, "a")["requeued_count"] == expected_requeues

    [t] = rt.poll("stuck")
    _age(rt, run, "a", 40)
    assert _requeue(rt) == 0
    row = rt.task(run, "a")
    assert row["status"] == "started"  # upstream leaves the status
    assert row["permanently_stalled_at"] is not None
    assert row["requeued_count"] == 3
    assert rt.messages("stuck") == []
    assert [m["msg_id"] for m in rt.archived("stuck")] == [msg_id]
    assert _requeue(rt) == 0  # never picked up again

    # The worker finally reports: a permanently stalled task can still complete.
    rt.complete(run, "a", 0, "finally")
    assert rt.task(run, "a")["status"] == "completed"
    [b] = rt.poll("stuck")
    rt.complete(run, "b", 0, "ok")
    assert rt.run(run)["status"] == "completed"


def test_permanently_stalled_task_that_fails_late_fails_instead_of_waiting_forever(rt):
    rt.flow("stuckfail", [{"slug": "a", "timeout": 1}], max_attempts=10, base_delay=0)
    run = rt.start("stuckfail", {})
    rt.conn.execute("UPDATE pgflow.step_tasks SET requeued_count = 3 WHERE run_id = %s", (run,))
    rt.poll("stuckfail")
    _age(rt, run, "a", 40)
    assert _requeue(rt) == 0
    assert rt.task(run, "a")["permanently_stalled_at"] is not None
    rt.fail(run, "a", 0, "late failure")
    assert rt.task(run, "a")["status"] == "failed"
    assert rt.run(run)["status"] == "failed"


def test_terminal_runs_and_steps_are_never_requeued(rt):
    """Even a task that (wrongly) stayed started under a terminal run/step is left alone."""
    rt.flow("term", [{"slug": "a", "timeout": 1}, {"slug": "b", "timeout": 1}], max_attempts=1)
    run = rt.start("term", {})
    claimed = rt.poll("term")
    assert len(claimed) == 2
    rt.fail(run, "a", 0, "end")
    assert rt.run(run)["status"] == "failed"

    # Fabricate the legacy (pre-0.15.1) state: b still started under the failed run.
    rt.conn.execute("UPDATE pgflow.step_tasks SET status = 'started' WHERE run_id = %s AND step_slug = 'b'", (run,))
    _age(rt, run, "b", 100)
    assert _requeue(rt) == 0
    assert rt.task(run, "b")["status"] == "started"
    assert rt.task(run, "b")["permanently_stalled_at"] is None

    # Same with a started run but a terminal step.
    rt.flow("term2", [{"slug": "s", "step_type": "map", "timeout": 1, "when_exhausted": "skip", "max_attempts": 1}])
    run2 = rt.start("term2", [1, 2])
    rt.poll("term2")
    rt.fail(run2, "s", 0)
    assert rt.statuses(run2)["s"] == "skipped"
    rt.conn.execute("UPDATE pgflow.step_tasks SET status = 'started' WHERE run_id = %s AND task_index = 1", (run2,))
    _age(rt, run2, "s", 100, index=1)
    assert _requeue(rt) == 0

    # repair the fabricated rows so the invariants hold again
    rt.conn.execute("UPDATE pgflow.step_tasks SET status = 'cancelled' WHERE run_id = %s AND step_slug = 'b'", (run,))
    rt.conn.execute("UPDATE pgflow.step_tasks SET status = 'skipped' WHERE run_id = %s AND task_index = 1", (run2,))


def test_requeue_skips_rows_locked_by_a_worker(rt, db):
    rt.flow("locked", [{"slug": "a", "timeout": 1}])
    run = rt.start("locked", {})
    rt.poll("locked")
    _age(rt, run, "a", 40)
    holder = db.connect(autocommit=False)
    holder.execute("SELECT 1 FROM pgflow.step_tasks WHERE run_id = %s FOR UPDATE", (run,))
    assert _requeue(rt) == 0  # SKIP LOCKED: does not wait, does not touch it
    holder.rollback()
    assert _requeue(rt) == 1


def test_requeued_message_vt_is_reset_even_when_claimed_long_ago(rt):
    rt.flow("vtreset", [{"slug": "a", "timeout": 100}])
    run = rt.start("vtreset", {})
    [t] = rt.poll("vtreset")
    assert rt.vt_in("vtreset", t["msg_id"]) == pytest.approx(102, abs=TOLERANCE)
    _age(rt, run, "a", 131)
    assert _requeue(rt) == 1
    assert [m["msg_id"] for m in rt.read("vtreset")] == [t["msg_id"]]

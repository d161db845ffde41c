"""Decision-table row "task completed, failed, skipped, cancelled or permanently stalled ->
archived_terminal".

The runtime archives a task's message when the task ends; a late copy of that message (here:
moved back from the archive, as a crashed archiver or an operator's replay would leave it) is
archived again by the claim, idempotently, and the task row stays exactly as it was.
"""

from __future__ import annotations

import pytest


def _late_message_is_archived(cl, *, queue, run, step, index, reason, worker):
    task = cl.task(run, step, index)
    msg = task["message_id"]
    assert msg in cl.archived(queue)
    cl.restore(queue, [msg])
    assert cl.read(queue) == [msg]

    result = cl.claim(queue, [msg], worker, queue)

    assert result.outcomes == {msg: ("archived_terminal", reason)}
    assert (result.rows[0]["run_id"], result.rows[0]["step_slug"], result.rows[0]["task_index"]) == (run, step, index)
    assert cl.task(run, step, index) == task
    assert cl.message(queue, msg) is None
    assert cl.archived(queue).count(msg) == 1
    assert result.notices == []
    # idempotent: the same id again is simply gone
    again = cl.claim(queue, [msg], worker, queue)
    assert again.outcomes == {msg: ("missing", "message_gone_task_exists")}
    assert cl.task(run, step, index) == task


def test_late_message_of_a_completed_task(cl):
    cl.flow("term", [{"slug": "a"}, {"slug": "b"}])
    run = cl.start("term", {})
    worker = cl.worker("term")
    claimed = cl.claim("term", cl.read("term"), worker, "term").claimed
    [a] = [r for r in claimed if r["step_slug"] == "a"]
    cl.complete(run, "a", 0, {"ok": True})
    assert cl.task(run, "a")["status"] == "completed"
    _late_message_is_archived(cl, queue="term", run=run, step="a", index=0, reason="task_completed", worker=worker)
    # the other task is untouched and still running
    assert (cl.task(run, "b")["status"], cl.task(run, "b")["attempts_count"]) == ("started", 1)


def test_late_messages_of_a_failed_task_and_its_cancelled_sibling(cl):
    cl.flow("term", [{"slug": "bad", "max_attempts": 1}, {"slug": "sibling"}])
    run = cl.start("term", {})
    worker = cl.worker("term")
    cl.claim("term", cl.read("term"), worker, "term")
    cl.fail(run, "bad", 0)
    assert cl.one("SELECT status FROM pgflow.runs WHERE run_id = %s", (run,))["status"] == "failed"
    assert cl.task(run, "sibling")["status"] == "cancelled"
    _late_message_is_archived(cl, queue="term", run=run, step="bad", index=0, reason="task_failed", worker=worker)
    _late_message_is_archived(cl, queue="term", run=run, step="sibling", index=0, reason="task_cancelled",
                              worker=worker)


def test_late_message_of_a_skipped_task(cl):
    # a map step whose first task fails for good is skipped; its other, still queued task is skipped with it
    cl.flow("term", [{"slug": "each", "step_type": "map", "max_attempts": 1, "when_exhausted": "skip"}])
    run = cl.start("term", [1, 2])
    worker = cl.worker("term")
    task0 = cl.task(run, "each", 0)
    assert cl.claim("term", [task0["message_id"]], worker, "term").outcomes == {task0["message_id"]: ("claimed", None)}
    cl.fail(run, "each", 0)
    assert cl.task(run, "each", 1)["status"] == "skipped"
    _late_message_is_archived(cl, queue="term", run=run, step="each", index=1, reason="task_skipped", worker=worker)
    _late_message_is_archived(cl, queue="term", run=run, step="each", index=0, reason="task_failed", worker=worker)


def test_late_message_of_a_permanently_stalled_task(cl):
    cl.flow("term", [{"slug": "a", "timeout": 1}])
    run = cl.start("term", {})
    worker = cl.worker("term")
    # Stalled recovery requeues a stalled task three times, then marks it permanently stalled and
    # archives its message. Each stall is produced by moving started_at back (instead of waiting).
    for _ in range(4):
        [msg] = cl.read("term")
        assert cl.claim("term", [msg], worker, "term").outcomes == {msg: ("claimed", None)}
        cl.conn.execute("UPDATE pgflow.step_tasks SET started_at = started_at - interval '1 minute', "
                        "queued_at = queued_at - interval '1 minute' WHERE run_id = %s", (run,))
        cl.conn.execute("SELECT pgflow.requeue_stalled_tasks()")
    task = cl.task(run, "a")
    assert task["status"] == "started" and task["permanently_stalled_at"] is not None
    assert task["attempts_count"] == 4
    _late_message_is_archived(cl, queue="term", run=run, step="a", index=0, reason="task_permanently_stalled",
                              worker=worker)


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_terminal_wins_over_read_count_and_the_reading_worker(cl, status):
    """However often the late message bounced and whichever worker of the flow reads it, a
    terminal task's message is only archived."""
    cl.flow("term", [{"slug": "a", "max_attempts": 1}, {"slug": "b"}])
    run = cl.start("term", {})
    worker = cl.worker("term")
    cl.claim("term", cl.read("term"), worker, "term")
    if status == "completed":
        cl.complete(run, "a", 0, 1)
    else:
        cl.fail(run, "a", 0)  # a fails for good, b is cancelled with the run
    step = "b" if status == "cancelled" else "a"
    task = cl.task(run, step)
    assert task["status"] == status
    msg = task["message_id"]
    cl.restore("term", [msg])
    for _ in range(3):
        cl.make_visible("term", [msg])
        assert cl.read("term") == [msg]
    result = cl.claim("term", [msg], cl.worker("term", function="another-fn"), "term")
    assert result.outcomes == {msg: ("archived_terminal", f"task_{status}")}
    assert cl.task(run, step) == task
    assert cl.message("term", msg) is None
    assert cl.function_row("another-fn")["enabled"] is True

"""Decision-table row "started task -> duplicate".

A second delivery of a started task (its claim visibility ran out, or another worker read it)
consumes no attempt, runs no handler and does not claim again; its message is deferred to the
task's existing recovery deadline (started_at + effective timeout + 30 s), never a fresh timeout,
and at least 2 s ahead when that deadline has already passed.
"""

from __future__ import annotations

from datetime import timedelta


def _started(cl, *, timeout=None):
    cl.flow("dup", [{"slug": "a", "timeout": timeout}], timeout=20)
    run = cl.start("dup", {})
    first = cl.worker("dup")
    [msg] = cl.read("dup")
    assert cl.claim("dup", [msg], first, "dup").outcomes == {msg: ("claimed", None)}
    return run, first, msg


def test_a_started_task_read_again_is_a_duplicate_deferred_to_its_recovery_deadline(cl):
    run, first, msg = _started(cl, timeout=5)
    task = cl.task(run, "a")
    cl.make_visible("dup", [msg])  # the claim visibility ran out while the handler still runs
    second = cl.worker("dup")
    assert cl.read("dup") == [msg]

    result = cl.claim("dup", [msg], second, "dup")

    assert result.outcomes == {msg: ("duplicate", "task_started")}
    row = result.rows[0]
    assert (row["run_id"], row["step_slug"], row["task_index"]) == (run, "a", 0)
    assert cl.task(run, "a") == task  # attempts, worker, started_at: all unchanged
    deadline = task["started_at"] + timedelta(seconds=5 + 30)  # the step's own timeout counts
    vt = cl.message("dup", msg)["vt"]
    # rounded up to whole seconds from the clock at the call
    assert deadline <= vt < deadline + timedelta(seconds=1)
    assert result.notices == []
    assert cl.archived("dup") == []


def test_the_same_worker_reading_its_own_task_again_gets_a_duplicate(cl):
    run, first, msg = _started(cl)
    cl.make_visible("dup", [msg])
    result = cl.claim("dup", cl.read("dup"), first, "dup")
    assert result.outcomes == {msg: ("duplicate", "task_started")}
    task = cl.task(run, "a")
    deadline = task["started_at"] + timedelta(seconds=20 + 30)  # flow timeout when the step has none
    assert deadline <= cl.message("dup", msg)["vt"] < deadline + timedelta(seconds=1)
    assert task["attempts_count"] == 1


def test_a_duplicate_past_its_recovery_deadline_is_deferred_two_seconds(cl):
    run, first, msg = _started(cl, timeout=5)
    # The task has been running far longer than timeout + 30 s (stalled recovery has not run).
    cl.conn.execute("UPDATE pgflow.step_tasks SET started_at = started_at - interval '10 minutes', "
                    "queued_at = queued_at - interval '10 minutes' WHERE run_id = %s", (run,))
    task = cl.task(run, "a")
    cl.make_visible("dup", [msg])

    result = cl.claim("dup", cl.read("dup"), cl.worker("dup"), "dup")

    assert result.outcomes == {msg: ("duplicate", "task_started")}
    assert cl.task(run, "a") == task
    vt = cl.message("dup", msg)["vt"]
    assert result.before + timedelta(seconds=2) <= vt <= result.after + timedelta(seconds=2)
    # it is a duplicate, never corruption: nothing paused, nothing archived
    assert cl.function_row("dup-worker")["enabled"] is True
    assert cl.archived("dup") == []


def test_repeated_duplicates_never_push_the_deadline_further(cl):
    run, first, msg = _started(cl, timeout=5)
    deadline = cl.task(run, "a")["started_at"] + timedelta(seconds=35)
    vts = []
    for _ in range(3):
        cl.make_visible("dup", [msg])
        assert cl.claim("dup", cl.read("dup"), cl.worker("dup"), "dup").outcomes == {msg: ("duplicate", "task_started")}
        vts.append(cl.message("dup", msg)["vt"])
    assert all(deadline <= vt < deadline + timedelta(seconds=1) for vt in vts)
    assert cl.task(run, "a")["attempts_count"] == 1

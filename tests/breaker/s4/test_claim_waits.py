"""Claims (0015) that wait for a run lock while the run ends under them: a sibling's final failure
fails the run, or ``drop_flow(force)`` deletes the whole flow and its queue. The claim continues
after the other transaction committed, with a classification it made partly before waiting. And
the start time a claim that waited records (F4)."""

from __future__ import annotations

import datetime as dt
import threading

import psycopg

from tests.runtime.driver import wait_until_blocked

DEADLINE = 60.0


def _claim_in_thread(cl, conn, queue, ids, worker, flow) -> tuple[threading.Thread, dict]:
    """Start ``cl.claim`` on ``conn`` in a thread (``conn`` is the thread's until it ends); returns
    the thread and a dict that gets ``claim`` or ``error``."""
    out: dict = {}

    def target() -> None:
        try:
            out["claim"] = cl.claim(queue, ids, worker, flow, conn=conn)
        except psycopg.Error as exc:
            out["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    return thread, out


def test_a_claim_waiting_while_a_sibling_fails_the_run_claims_nothing_and_stops_nothing(cl):
    cl.flow("fails", [{"slug": "each", "step_type": "map"}], max_attempts=1)
    run = cl.start("fails", [0, 1, 2, 3])
    ids = cl.read("fails")
    first, second = cl.worker("fails"), cl.worker("fails")
    assert len(cl.claim("fails", ids[:1], first, "fails").claimed) == 1
    holder = cl.connect()
    holder.execute("SET statement_timeout = '60s'")  # a hang guard: the drop must not wait for ever
    holder.execute("BEGIN")
    holder.execute("SELECT pgflow.fail_task(%s, 'each', 0, 'final')", (run,))  # fails the run, holds its lock
    conn = cl.connect()
    pid = cl.val("SELECT pg_backend_pid() AS p", conn=conn)  # before the thread uses the connection
    thread, out = _claim_in_thread(cl, conn, "fails", ids[1:], second, "fails")
    wait_until_blocked(cl.conn, pid)
    holder.execute("COMMIT")
    thread.join(timeout=DEADLINE)
    assert not thread.is_alive(), "the claim never ended"
    assert "error" not in out, out.get("error")
    outcomes = {o for o, _ in out["claim"].outcomes.values()}
    assert outcomes <= {"missing", "archived_terminal"}, out["claim"].outcomes
    assert cl.val("SELECT status FROM pgflow.runs WHERE run_id = %s", (run,)) == "failed"
    assert cl.worker_row(second)["deprecated_at"] is None
    assert cl.function_row("fails-worker") is None or cl.function_row("fails-worker")["enabled"] is True


def test_a_claim_waiting_while_the_flow_is_dropped_raises_or_claims_nothing_and_pauses_nothing(gappy):
    cl = gappy
    cl.flow("gone", [{"slug": "each", "step_type": "map"}])
    cl.start("gone", [0, 1])
    ids = cl.read("gone")
    worker = cl.worker("gone")
    holder = cl.connect()
    holder.execute("SET statement_timeout = '60s'")  # a hang guard: the drop must not wait for ever
    holder.execute("BEGIN")
    holder.execute("SELECT pgflow._lock_flow_for_deletion('gone')")
    conn = cl.connect()
    pid = cl.val("SELECT pg_backend_pid() AS p", conn=conn)  # before the thread uses the connection
    thread, out = _claim_in_thread(cl, conn, "gone", ids, worker, "gone")
    wait_until_blocked(cl.conn, pid)
    holder.execute("SELECT pgflow.drop_flow('gone', true)")
    holder.execute("COMMIT")
    thread.join(timeout=DEADLINE)
    assert not thread.is_alive(), "the claim never ended"
    if "claim" in out:
        assert {o for o, _ in out["claim"].outcomes.values()} <= {"missing"}, out["claim"].outcomes
    # whatever the claim saw, it must not leave a paused function behind for a flow that is gone
    assert cl.function_row("gone-worker") is None or cl.function_row("gone-worker")["enabled"] is True, (
        out, cl.function_row("gone-worker"))


def test_a_claim_that_waited_for_a_lock_counts_its_start_from_when_it_claimed(cl):
    """Finding F4 of the s4 breaker: the claim set started_at = now(), its statement's start, so a
    claim that waited W for a lock got a recovery deadline (started_at + timeout + 30 s) W early,
    and a wait over 28 s let requeue_stalled_tasks hand a running task to a second worker.
    0015 takes the claim's clock_timestamp()."""
    cl.flow("late", [{"slug": "a"}], timeout=5)
    run = cl.start("late", {})
    ids = cl.read("late")
    worker = cl.worker("late")
    holder = cl.connect()
    holder.execute("SET statement_timeout = '60s'")  # a hang guard: the drop must not wait for ever
    holder.execute("BEGIN")
    holder.execute("SELECT 1 FROM pgflow.runs WHERE run_id = %s FOR UPDATE", (run,))  # a report of the run
    conn = cl.connect()
    pid = cl.val("SELECT pg_backend_pid() AS p", conn=conn)  # before the thread uses the connection
    thread, out = _claim_in_thread(cl, conn, "late", ids, worker, "late")
    wait_until_blocked(cl.conn, pid)
    released_at = cl.val("SELECT clock_timestamp() AS t", conn=holder)
    holder.execute("COMMIT")
    thread.join(timeout=DEADLINE)
    assert not thread.is_alive(), "the claim never ended"
    assert [r["outcome"] for r in out["claim"].rows] == ["claimed"]
    task = cl.task(run, "a")
    vt = cl.message("late", ids[0])["vt"]
    assert vt >= released_at + dt.timedelta(seconds=5 + 2)  # the message: hidden from the claim on
    # the recovery deadline, started_at + timeout + 30 s, must count from the claim too
    assert task["started_at"] >= released_at, (task["started_at"], released_at)

"""Claims (0015) that wait for a run lock while the run ends under them: a sibling's final failure
fails the run, or ``drop_flow(force)`` deletes the whole flow and its queue. The claim continues
after the other transaction committed, with a classification it made partly before waiting."""

from __future__ import annotations

import threading

import psycopg

from tests.runtime.driver import wait_until_blocked

DEADLINE = 60.0


def _claim_in_thread(cl, conn, queue, ids, worker, flow) -> tuple[threading.Thread, dict]:
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
    holder.execute("BEGIN")
    holder.execute("SELECT pgflow.fail_task(%s, 'each', 0, 'final')", (run,))  # fails the run, holds its lock
    conn = cl.connect()
    thread, out = _claim_in_thread(cl, conn, "fails", ids[1:], second, "fails")
    wait_until_blocked(cl.conn, cl.val("SELECT pg_backend_pid() AS p", conn=conn))
    holder.execute("COMMIT")
    thread.join(timeout=DEADLINE)
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
    holder.execute("BEGIN")
    holder.execute("SELECT pgflow._lock_flow_for_deletion('gone')")
    conn = cl.connect()
    thread, out = _claim_in_thread(cl, conn, "gone", ids, worker, "gone")
    wait_until_blocked(cl.conn, cl.val("SELECT pg_backend_pid() AS p", conn=conn))
    holder.execute("SELECT pgflow.drop_flow('gone', true)")
    holder.execute("COMMIT")
    thread.join(timeout=DEADLINE)
    if "claim" in out:
        assert {o for o, _ in out["claim"].outcomes.values()} <= {"missing"}, out["claim"].outcomes
    # whatever the claim saw, it must not leave a paused function behind for a flow that is gone
    assert cl.function_row("gone-worker") is None or cl.function_row("gone-worker")["enabled"] is True, (
        out, cl.function_row("gone-worker"))

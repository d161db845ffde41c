"""Batch reports (0014) killed mid-way and racing each other in every lock order.

* A ``complete_tasks`` batch whose set-based pass has already updated tasks, step states and runs
  and started the next steps, killed (``pg_terminate_backend``) while it waits to archive a
  message: nothing of it stays, and the same batch sent again applies once.
* Four sessions report the same runs' tasks (completions, failures, late repeats, claims of the
  next steps, stalled-task recovery) in shuffled element orders, again and again: no deadlock
  (40P01), every task ends once.
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.claim.helpers import ClaimEnv
from tests.runtime.driver import wait_until_blocked

DEADLINE = 120.0


def _elements(claimed: list[dict], value) -> Jsonb:
    return Jsonb([{"run_id": str(r["run_id"]), "step_slug": r["step_slug"], "task_index": r["task_index"],
                   "output": value} for r in claimed])


def test_a_batch_killed_while_archiving_leaves_nothing_and_applies_once_when_sent_again(gappy):
    cl = gappy
    cl.flow("kill", [{"slug": "a"}, {"slug": "b", "deps": ["a"]}])
    runs = [cl.start("kill", {"n": n}) for n in range(3)]
    worker = cl.worker("kill")
    claimed = cl.claim("kill", cl.read("kill"), worker, "kill").claimed
    assert len(claimed) == 3
    before = cl.snapshot()
    # a session that holds the queue row of run 1's message (a PGMQ reader mid-statement would)
    holder = cl.connect()
    holder.execute("BEGIN")
    holder.execute("SELECT 1 FROM pgmq.q_kill WHERE msg_id = %s FOR UPDATE", (claimed[1]["message_id"],))
    victim = cl.connect()
    pid = cl.val("SELECT pg_backend_pid() AS pid", conn=victim)
    errors: list[BaseException] = []

    def report() -> None:
        try:
            victim.execute("SELECT * FROM pgflow.complete_tasks(%s)", (_elements(list(reversed(claimed)), "out"),))
        except BaseException as exc:  # the terminated connection
            errors.append(exc)

    thread = threading.Thread(target=report)
    thread.start()
    wait_until_blocked(cl.conn, pid)
    # it waits where only the archive waits: after every update of the batch
    assert cl.val("SELECT query FROM pg_stat_activity WHERE pid = %s", (pid,)).startswith("SELECT * FROM pgflow.complete_tasks")
    assert cl.val("SELECT pg_terminate_backend(%s) AS ok", (pid,)) is True
    thread.join(timeout=DEADLINE)
    assert not thread.is_alive(), "the report never ended"
    assert errors and isinstance(errors[0], psycopg.OperationalError)
    holder.execute("ROLLBACK")
    assert cl.snapshot() == before
    # the pass had gone as far as sending the next steps' messages: their ids are used up
    assert cl.val("SELECT last_value AS n FROM pg_sequences WHERE sequencename = 'q_kill_msg_id_seq'") == 6
    rows = cl.rows("SELECT status FROM pgflow.complete_tasks(%s)", (_elements(claimed, "out"),))
    assert [r["status"] for r in rows] == ["completed"] * 3
    nxt = cl.claim("kill", cl.read("kill"), worker, "kill").claimed
    assert sorted((r["run_id"], r["step_slug"]) for r in nxt) == sorted((run, "b") for run in runs)
    assert all(r["input"] == {"a": "out"} for r in nxt)


def _reporter(cl: ClaimEnv, seed: int, tasks: list[dict], worker, stop: threading.Event,
              deadlocks: list[int], errors: list[str]) -> None:
    rnd = random.Random(seed)
    conn = cl.connect()
    for _ in range(40):
        if stop.is_set():
            return
        picked = rnd.sample(tasks, k=rnd.randint(1, len(tasks)))
        picked += rnd.sample(picked, k=min(len(picked), rnd.randint(0, 2)))  # repeats: late reports of the same batch
        try:
            roll = rnd.random()
            if roll < 0.5:
                conn.execute("SELECT * FROM pgflow.complete_tasks(%s)", (_elements(picked, {"by": seed}),))
            elif roll < 0.75:
                conn.execute("SELECT * FROM pgflow.fail_tasks(%s)", (Jsonb([{
                    "run_id": str(r["run_id"]), "step_slug": r["step_slug"], "task_index": r["task_index"],
                    "error_message": f"by {seed}"} for r in picked]),))
            elif roll < 0.9:
                ids = [r["msg_id"] for r in conn.execute("SELECT msg_id FROM pgmq.read('race', 0, 20)").fetchall()]
                rnd.shuffle(ids)
                rows = conn.execute("SELECT * FROM pgflow.claim_tasks('race', %s::bigint[], %s, 'race', NULL)",
                                    (ids, worker)).fetchall()
                cl.record_rows(rows)
                with cl._lock:
                    tasks.extend(r for r in rows if r["outcome"] == "claimed")
            else:
                conn.execute("SELECT pgflow.requeue_stalled_tasks()")
        except psycopg.errors.DeadlockDetected:
            deadlocks.append(seed)
        except psycopg.Error as exc:
            errors.append(f"{exc.sqlstate}: {exc}")
            stop.set()


def test_four_sessions_reporting_the_same_runs_in_every_order_never_deadlock(gappy):
    cl = gappy
    cl.flow("race", [{"slug": "m", "step_type": "map"}, {"slug": "x"}, {"slug": "y", "deps": ["x"]},
                     {"slug": "z", "deps": ["m", "y"]}], max_attempts=4, base_delay=0)
    for n in range(8):
        cl.start("race", list(range(n % 4)))
    workers = [cl.worker("race") for _ in range(4)]
    tasks = cl.claim("race", cl.read("race", qty=1000), workers[0], "race").claimed
    stop = threading.Event()
    deadlocks: list[int] = []
    errors: list[str] = []
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_reporter, cl, seed, tasks, workers[seed], stop, deadlocks, errors)
                   for seed in range(4)]
        for f in futures:
            f.result(timeout=DEADLINE)
    assert errors == []
    assert deadlocks == [], f"{len(deadlocks)} deadlock(s) (40P01)"
    for task in cl.rows("SELECT status, attempts_count FROM pgflow.step_tasks"):
        assert task["attempts_count"] <= 4


@pytest.mark.parametrize("kind", ["complete", "fail", "complete_task"])
def test_a_report_that_waited_behind_a_newer_claim_of_its_task_is_applied(gappy, kind):
    """A stale worker's report (its attempt failed and the task was claimed again) waits for the
    run lock; the new claim starts after the report's statement and commits first. Finding F2 of
    the s4 breaker: the report wrote completed_at/failed_at = now(), earlier than the new claim's
    started_at, and failed step_tasks' CHECK (23514); 0016 ends a task at the later of the two."""
    cl = gappy
    cl.flow("stale", [{"slug": "a"}], max_attempts=2, base_delay=0)  # a failure of the second attempt is final
    run = cl.start("stale", {})
    old, new = cl.worker("stale"), cl.worker("stale")
    ids = cl.read("stale")
    cl.claim("stale", ids, old, "stale")
    cl.fail(run, "a", 0, "first attempt")  # retried at once: queued, its message visible
    holder = cl.connect()  # someone holding the run FOR SHARE (a claim of another task of the run)
    holder.execute("BEGIN")
    holder.execute("SELECT 1 FROM pgflow.runs WHERE run_id = %s FOR SHARE", (run,))
    reporter = cl.connect()
    pid = cl.val("SELECT pg_backend_pid() AS pid", conn=reporter)
    outcome: dict = {}

    def report() -> None:
        key = "output" if kind == "complete" else "error_message"
        try:
            if kind == "complete_task":  # the single call (0002 on): the same
                outcome["rows"] = reporter.execute("SELECT status FROM pgflow.complete_task(%s, 'a', 0, '1')",
                                                   (run,)).fetchall()
                return
            outcome["rows"] = reporter.execute(f"SELECT status FROM pgflow.{kind}_tasks(%s)", (Jsonb([
                {"run_id": str(run), "step_slug": "a", "task_index": 0, key: "late"}]),)).fetchall()
        except psycopg.Error as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=report)
    thread.start()
    wait_until_blocked(cl.conn, pid)  # the report's statement (and its now()) began
    again = cl.claim("stale", cl.read("stale"), new, "stale")  # FOR SHARE beside the holder: goes through
    assert [r["outcome"] for r in again.rows] == ["claimed"]
    holder.execute("COMMIT")
    thread.join(timeout=DEADLINE)
    assert not thread.is_alive(), "the report never ended"
    if "error" in outcome:
        raise outcome["error"]
    task = cl.task(run, "a")
    assert task["status"] in ("completed", "queued", "failed")
    assert outcome["rows"]

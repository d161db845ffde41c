"""Concurrent claims of the same messages on real connections.

Every task is claimed exactly once; a claim that loses the race sees the winner's tasks as
duplicates (no attempt, no second handler). Waits are hang guards, never speed claims.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

DEADLINE = 60.0


def _wait_until_blocked(cl, pid: int) -> None:
    """Wait until backend ``pid`` waits for a lock (proves the interleaving; a hang guard only)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        row = cl.one("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,))
        if row and row["wait_event_type"] == "Lock":
            return
        assert time.monotonic() < deadline, "the second claim never waited for the first one's locks"
        time.sleep(0.02)


def test_a_claim_waiting_for_another_sees_its_tasks_as_duplicates(cl):
    cl.flow("race", [{"slug": "each", "step_type": "map"}])
    run = cl.start("race", list(range(8)))
    batch = cl.read("race")
    first, second = cl.worker("race"), cl.worker("race")
    conn_a, conn_b = cl.connect(), cl.connect()
    pid_b = cl.val("SELECT pg_backend_pid()", conn=conn_b)

    with ThreadPoolExecutor(1) as pool:
        with conn_a.transaction():
            a = cl.claim("race", batch, first, "race", conn=conn_a)
            assert len(a.claimed) == 8
            b_future = pool.submit(cl.claim, "race", batch, second, "race", None, conn_b)
            _wait_until_blocked(cl, pid_b)
        b = b_future.result(timeout=DEADLINE)

    assert b.outcomes == {m: ("duplicate", "task_started") for m in batch}
    for task in cl.tasks(run):
        assert (task["status"], task["attempts_count"], task["last_worker_id"]) == ("started", 1, first)
    assert cl.function_row("race-worker")["enabled"] is True


def test_simultaneous_claims_of_the_same_batch_claim_each_task_once(cl):
    cl.flow("race", [{"slug": "each", "step_type": "map"}])
    workers = [cl.worker("race") for _ in range(3)]
    conns = [cl.connect() for _ in workers]
    for round_no in range(15):
        run = cl.start("race", list(range(6)))
        batch = cl.read("race")
        assert len(batch) == 6
        gate = threading.Barrier(len(workers))

        def claim(i: int, gate: threading.Barrier = gate, batch: list[int] = batch):
            gate.wait(timeout=DEADLINE)
            return cl.claim("race", batch, workers[i], "race", conn=conns[i])

        with ThreadPoolExecutor(len(workers)) as pool:
            results = list(pool.map(claim, range(len(workers))))

        winners: dict[int, int] = {}
        for i, result in enumerate(results):
            assert set(result.outcomes) == set(batch)
            for msg, (outcome, reason) in result.outcomes.items():
                assert outcome in ("claimed", "duplicate"), (round_no, outcome, reason)
                if outcome == "claimed":
                    assert msg not in winners, f"message {msg} claimed twice in round {round_no}"
                    winners[msg] = i
        assert sorted(winners) == sorted(batch), f"round {round_no}: some task was never claimed"
        for task in cl.tasks(run):
            assert task["attempts_count"] == 1
            assert task["last_worker_id"] == workers[winners[task["message_id"]]]
            cl.complete(run, "each", task["task_index"], task["task_index"])


def test_overlapping_batches_in_opposite_order_do_not_deadlock(cl):
    cl.flow("race", [{"slug": "each", "step_type": "map"}])
    first, second = cl.worker("race"), cl.worker("race")
    conn_a, conn_b = cl.connect(), cl.connect()
    for _ in range(10):
        run = cl.start("race", list(range(10)))
        ids = cl.read("race")
        part_a, part_b = ids[:7], list(reversed(ids[3:]))
        gate = threading.Barrier(2)

        def claim(worker, part, conn, gate: threading.Barrier = gate):
            gate.wait(timeout=DEADLINE)
            return cl.claim("race", part, worker, "race", conn=conn)

        with ThreadPoolExecutor(2) as pool:
            fa = pool.submit(claim, first, part_a, conn_a)
            fb = pool.submit(claim, second, part_b, conn_b)
            a, b = fa.result(timeout=DEADLINE), fb.result(timeout=DEADLINE)  # a deadlock would raise here
        assert sorted(a.ids("claimed") + b.ids("claimed")) == sorted(ids)  # each exactly once
        for m in ids[3:7]:  # the overlap: one claim wins, the other sees a duplicate
            assert sorted([a.outcomes[m][0], b.outcomes[m][0]]) == ["claimed", "duplicate"]
        for task in cl.tasks(run):
            assert task["attempts_count"] == 1
            cl.complete(run, "each", task["task_index"], None)


def test_a_fatal_batch_racing_a_valid_claim_changes_none_of_its_tasks(cl):
    """B's batch holds A's tasks plus a fatal message. B waits for A's locks; once A committed,
    B stops: it claims nothing and does not touch the tasks A now owns."""
    cl.flow("race", [{"slug": "each", "step_type": "map"}])
    run = cl.start("race", [1, 2, 3])
    bad = cl.send("race", json.dumps({"flow_slug": "race", "run_id": str(uuid.uuid4()), "step_slug": "each",
                                      "task_index": 0}))
    batch = cl.read("race")
    valid = [m for m in batch if m != bad]
    first = cl.worker("race")
    second = cl.worker("race", function="race-other")
    conn_a, conn_b = cl.connect(), cl.connect()
    pid_b = cl.val("SELECT pg_backend_pid()", conn=conn_b)

    with ThreadPoolExecutor(1) as pool:
        with conn_a.transaction():
            assert len(cl.claim("race", valid, first, "race", conn=conn_a).claimed) == 3
            b_future = pool.submit(cl.claim, "race", batch, second, "race", None, conn_b)
            _wait_until_blocked(cl, pid_b)
        owned = cl.tasks(run)
        b = b_future.result(timeout=DEADLINE)

    assert b.outcomes == {**{m: ("released", "batch_released") for m in valid}, bad: ("fatal", "task_missing")}
    assert cl.tasks(run) == owned
    assert all((t["status"], t["last_worker_id"]) == ("started", first) for t in owned)
    assert cl.function_row("race-other")["enabled"] is False
    assert cl.function_row("race-worker")["enabled"] is True
    # the bad message stays, visible; once it is removed, A's messages (visible again with the
    # batch) are only duplicates for anyone who reads them
    assert cl.visible_now("race", [bad]) == {bad: True}
    cl.conn.execute("SELECT pgmq.archive('race', %s::bigint)", (bad,))
    again = cl.claim("race", cl.read("race"), cl.worker("race", function="race-third"), "race")
    assert again.outcomes == {m: ("duplicate", "task_started") for m in valid}
    assert all(t["attempts_count"] == 1 for t in cl.tasks(run))

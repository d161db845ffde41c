"""A hostile production on real connections: claims (0015) and batch reports (0014) racing.

Four sessions loop over the same runs of two flows at once: each reads messages with a visibility
of 0 s (so every session sees the others' messages again, the overlapping batches of workers whose
reads expired), claims them in batches with repeated ids, NULLs and shuffled order, then reports
what it claimed through ``complete_tasks`` and ``fail_tasks`` in shuffled order, sometimes with a
task twice (the second element a late report), and now and then runs
``requeue_stalled_tasks``. Every session switches routes (two flows, two queues) in one session, so
``claim_tasks``' generic plans serve several routes.

What must hold: no deadlock (every statement takes its locks in run_id order), no error other than
those the contract names (a late report behind a newer claim of its task is recorded since 0016), every task
claimed exactly as often as its ``attempts_count`` says (the claim ledger of tests/claim/helpers.py),
and the runtime invariants afterwards (tests/support/invariants.py: no task lost, no message left
behind, bookkeeping intact). The same with the sessions behind a real PgBouncer in transaction mode.
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.claim.helpers import ClaimEnv

DEADLINE = 120.0
SESSIONS = 4
ROUNDS = 60


def _flows(cl: ClaimEnv) -> None:
    """Two flows of different shapes: a root map feeding a single step, and a fan-out chain."""
    cl.flow("storm_map", [{"slug": "each", "step_type": "map"}, {"slug": "sum", "deps": ["each"]}],
            max_attempts=3)
    cl.flow("storm_chain", [{"slug": "one"}, {"slug": "two", "deps": ["one"]}, {"slug": "three", "deps": ["one"]}],
            max_attempts=3)


def _session(cl: ClaimEnv, seed: int, stop: threading.Event, errors: list[str], deadlocks: list[int]) -> None:
    rnd = random.Random(seed)
    conn = cl.connect()
    workers = {flow: cl.worker(flow) for flow in ("storm_map", "storm_chain")}
    mine: list[dict] = []
    for _ in range(ROUNDS):
        if stop.is_set():
            return
        flow = rnd.choice(list(workers))
        try:
            ids = [r["msg_id"] for r in conn.execute("SELECT msg_id FROM pgmq.read(%s, 0, %s)",
                                                     (flow, rnd.randint(1, 12))).fetchall()]
            batch: list[int | None] = ids + rnd.sample(ids, k=min(len(ids), rnd.randint(0, 3)))
            if rnd.random() < 0.3:
                batch.append(None)
            rnd.shuffle(batch)
            rows = conn.execute("SELECT * FROM pgflow.claim_tasks(%s, %s::bigint[], %s, %s, NULL)",
                                (flow, batch, workers[flow], flow)).fetchall()
            cl.record_rows(rows)
            bad = [r for r in rows if r["outcome"] in ("fatal", "released")]
            if bad:
                errors.append(f"fatal claim: {[(r['message_id'], r['outcome'], r['reason']) for r in bad]}")
                stop.set()
                return
            mine += [r for r in rows if r["outcome"] == "claimed"]
            rnd.shuffle(mine)
            report, mine = mine[: rnd.randint(0, len(mine))], mine[len(mine) // 2:]
            if report:
                elements = [{"run_id": str(r["run_id"]), "step_slug": r["step_slug"], "task_index": r["task_index"],
                             "output": r["task_index"] if r["step_slug"] == "each" else {"n": rnd.randint(0, 9)}}
                            for r in report]
                if rnd.random() < 0.3:
                    elements.append(rnd.choice(elements))  # the same task twice
                if rnd.random() < 0.2:
                    conn.execute("SELECT * FROM pgflow.fail_tasks(%s)", (Jsonb(
                        [dict({k: v for k, v in e.items() if k != "output"}, error_message="boom") for e in elements]),))
                else:
                    conn.execute("SELECT * FROM pgflow.complete_tasks(%s)", (Jsonb(elements),))
            if rnd.random() < 0.15:
                conn.execute("SELECT pgflow.requeue_stalled_tasks()")
        except psycopg.errors.DeadlockDetected:
            deadlocks.append(seed)
        except psycopg.Error as exc:
            errors.append(f"{type(exc).__name__} {exc.sqlstate}: {exc}")
            stop.set()
            return


@pytest.mark.parametrize("via", ["direct", "pgbouncer"])
def test_claims_and_batch_reports_of_four_sessions_never_deadlock_or_lose_a_task(gappy, via, request):
    """(``gappy``: a report refused by F2 used up message ids, which message conservation would count.)

    ``pgbouncer``: the four sessions are client connections of a real PgBouncer in transaction mode
    that resets every server connection after each transaction, so each statement may run in another
    server session than the one before (the generic plans above then belong to the pooler's sessions).
    """
    cl = gappy
    if via == "pgbouncer":
        cl.db = cl.db.through(request.getfixturevalue("pgbouncer"))
    _flows(cl)
    for i in range(12):
        cl.start("storm_map", list(range(i + 3)))
        cl.start("storm_chain", {"i": i})
    stop = threading.Event()
    errors: list[str] = []
    deadlocks: list[int] = []
    for wave in range(3):
        with ThreadPoolExecutor(SESSIONS) as pool:
            futures = [pool.submit(_session, cl, 1000 * wave + s, stop, errors, deadlocks) for s in range(SESSIONS)]
            for f in futures:
                f.result(timeout=DEADLINE)
        assert not errors, errors
        for i in range(3):
            cl.start("storm_map", list(range(i + 1)))
            cl.start("storm_chain", {"wave": wave, "i": i})
    assert deadlocks == [], f"{len(deadlocks)} deadlock(s) (40P01) between claims and batch reports"
    statuses = {r["status"] for r in cl.rows("SELECT status FROM pgflow.runs")}
    assert statuses <= {"started", "completed", "failed"}
    # the claim ledger, message conservation and the runtime invariants: the fixture, afterwards

"""Cancel racing with workers and with complete_manual_task, on several real connections.

Four connections cancel every run (each in its own order, each run once a worker has completed
one of its tasks) while two workers claim and complete map
tasks and a fifth connection completes the runs' manual tasks; all start at one barrier. Then: no
call deadlocked or hung (``concurrently`` fails on either), every task ended exactly once, and every
report is accounted for: applied before its run's cancel, or refused and counted on its task
(``refused_reports``), never applied after it. Tasks claimed before the race and reported after it
show the refusal deterministically.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tests.runtime.driver import Runtime, concurrently

RUNS = 10
ELEMENTS = 5
CANCELLERS = 4


def _flow(rt) -> list[uuid.UUID]:
    rt.flow("race", [{"slug": "each", "step_type": "map"}, {"slug": "approve"}], max_attempts=1, base_delay=0)
    rt.conn.execute("SELECT pgflow._set_step_manual('race', 'approve')")
    return [rt.start("race", list(range(ELEMENTS))) for _ in range(RUNS)]


def test_cancel_from_four_connections_races_with_workers_and_manual_completions(rt, db):
    runs = _flow(rt)
    stragglers = rt.poll("race", qty=3)  # claimed now, reported only after the race
    assert len(stragglers) == 3

    def worker(conn: psycopg.Connection) -> list[tuple[tuple, str]]:
        me = Runtime(conn, level="upgraded")
        reports = []
        while True:
            claimed = me.poll("race", qty=4)
            if not claimed:
                if not conn.execute("SELECT 1 FROM pgflow.runs WHERE flow_slug = 'race' AND status = 'started' "
                                    "LIMIT 1").fetchone():
                    return reports
                continue
            for task in claimed:
                row = me.complete(task["run_id"], task["step_slug"], task["task_index"], {"i": task["task_index"]})
                reports.append(((task["run_id"], task["step_slug"], task["task_index"]), row["status"]))

    def approver(conn: psycopg.Connection) -> dict[uuid.UUID, str]:
        outcomes = {}
        for run_id in runs:
            try:
                conn.execute("SELECT pgflow.complete_manual_task(%s, 'approve', 0, %s)", (run_id, Jsonb({"ok": 1})))
                outcomes[run_id] = "applied"
            except psycopg.Error as exc:
                assert exc.sqlstate == "PF011", exc  # not active: its run was cancelled first
                outcomes[run_id] = "refused"
        return outcomes

    def canceller(number: int):
        order = random.Random(number).sample(runs, len(runs))

        def cancel(conn: psycopg.Connection) -> dict[uuid.UUID, Any]:
            results: dict[uuid.UUID, Any] = {}
            for run_id in order:
                # mid-run: once a worker completed one of its tasks (or the run ended meanwhile)
                while conn.execute("SELECT r.status = 'started' AND NOT EXISTS (SELECT 1 FROM pgflow.step_tasks AS t "
                                   "WHERE t.run_id = r.run_id AND t.step_slug = 'each' AND t.status = 'completed') "
                                   "FROM pgflow.runs AS r WHERE r.run_id = %s", (run_id,)).fetchone()[0]:
                    pass
                try:
                    conn.execute("SELECT * FROM pgflow.cancel_run(%s, %s)", (run_id, f"canceller {number}"))
                    # the reason recorded: this cancel's, or the one that took effect first
                    row = conn.execute("SELECT reason FROM pgflow.run_cancellations WHERE run_id = %s",
                                       (run_id,)).fetchone()
                    results[run_id] = row[0]
                except psycopg.Error as exc:
                    assert exc.sqlstate == "PF013", exc  # it completed before this cancel
                    results[run_id] = "completed"
            return results
        return cancel

    calls = [worker, worker, approver] + [canceller(n) for n in range(CANCELLERS)]
    first, second, approvals, *cancels = concurrently(db, calls, deadline=120)

    late = [rt.complete(t["run_id"], t["step_slug"], t["task_index"], {"late": True}) for t in stragglers]
    assert [row["status"] for row in late] == ["cancelled"] * 3

    state = {r["run_id"]: r for r in rt.rows(
        "SELECT r.*, c.cancelled_at, c.reason AS cancel_reason FROM pgflow.runs AS r "
        "LEFT JOIN pgflow.run_cancellations AS c ON c.run_id = r.run_id WHERE r.flow_slug = 'race'")}
    tasks = {(t["run_id"], t["step_slug"], t["task_index"]): t
             for t in rt.rows("SELECT * FROM pgflow.step_tasks WHERE flow_slug = 'race'")}
    assert len(tasks) == RUNS * (ELEMENTS + 1)
    for run_id, run in state.items():
        winners = [c[run_id] for c in cancels if c[run_id] not in ("completed",)]
        if run["status"] == "completed":  # every task was done before any cancel reached it
            assert set(winners) == set() and run["cancelled_at"] is None
            continue
        assert run["status"] == "failed" and run["cancelled_at"] is not None
        # one cancel took effect; the others returned that same run unchanged
        assert run["cancel_reason"] in {f"canceller {n}" for n in range(CANCELLERS)}
        assert set(winners) == {run["cancel_reason"]}

    # every task ended exactly once: terminal, and each applied report is the only one that ended it
    assert {t["status"] for t in tasks.values()} <= {"completed", "cancelled"}
    reports = first + second + [((t["run_id"], t["step_slug"], t["task_index"]), row["status"])
                                for t, row in zip(stragglers, late, strict=True)]
    applied = Counter(key for key, status in reports if status == "completed")
    refused = Counter(key for key, status in reports if status == "cancelled")
    assert set(key for key, _ in reports) <= set(tasks)
    for key, task in tasks.items():
        run = state[key[0]]
        if key[1] == "approve":
            assert task["status"] == ("completed" if approvals[key[0]] == "applied" else "cancelled")
            continue
        assert applied[key] <= 1
        assert (task["status"] == "completed") == (applied[key] == 1), key
        assert task["refused_reports"] == refused[key], key  # no report lost, none applied late
        if task["status"] == "completed" and run["cancelled_at"] is not None:
            assert task["completed_at"] <= run["cancelled_at"]
    assert sum(refused.values()) >= 3
    assert rt.one("SELECT count(*) AS n FROM pgmq.q_race")["n"] == 0

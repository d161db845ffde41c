"""Server CPU cost of the batch entry points of the queue stage next to the single calls they batch.

Measured as the backend's own CPU time (``/proc/<pid>/schedstat`` of the connection's server
process), so time the backend spends descheduled on a busy machine does not count; each figure is
work done per CPU second (higher is better).

Per sample, a fresh database with a 3-step linear flow (a -> b -> c, no-op outputs), one worker
registered, a warm-up of 10 runs driven to completion and ``ANALYZE`` (not timed). Then, timed on
the backend's CPU clock (reads and claims are not counted):

* ``start_flow``: N runs started one call each (baseline), then ``start_flows``: N runs started in
  calls of 50;
* ``complete_task``: the 2N claimed tasks of step a (both starts' runs) completed one call each
  (each starts step b) (baseline), then ``complete_tasks``: the 2N claimed tasks of step b
  completed in calls of 10 (each starts step c).

Checked after timing: every run reached step c with its tasks queued.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import psycopg
from psycopg.types.json import Jsonb

from bench.core import Context, Result

FLOW = "benchCosts"


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/schedstat", encoding="ascii") as stat:
        return int(stat.read().split()[0]) / 1e9


def _sample(ctx: Context, runs: int) -> dict[str, float]:
    with ctx.database("sql_costs") as conninfo, psycopg.connect(conninfo, autocommit=True) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        conn.execute("SELECT pgflow.create_flow(%s)", (FLOW,))
        for step, deps in (("a", []), ("b", ["a"]), ("c", ["b"])):
            conn.execute("SELECT pgflow.add_step(%s, %s, %s::text[])", (FLOW, step, deps))
        queue = FLOW.lower()
        worker = uuid.uuid4()
        conn.execute("SELECT pgflow.register_worker(%s, 'bench-costs', %s, %s)", (worker, queue, FLOW))

        def claim_all() -> list[tuple]:
            claimed: list[tuple] = []
            while ids := [r[0] for r in conn.execute("SELECT msg_id FROM pgmq.read(%s, 60, 50)", (queue,)).fetchall()]:
                claimed += conn.execute(
                    "SELECT run_id, step_slug, task_index FROM pgflow.claim_tasks(%s, %s, %s, %s) WHERE outcome = 'claimed'",
                    (queue, ids, worker, FLOW)).fetchall()
            return claimed

        def complete_one(tasks: list[tuple]) -> None:
            for run_id, step, index in tasks:
                conn.execute("SELECT count(*) FROM pgflow.complete_task(%s, %s, %s, '{}')", (run_id, step, index))

        def complete_batches(tasks: list[tuple]) -> None:
            for k in range(0, len(tasks), 10):
                conn.execute("SELECT count(*) FROM pgflow.complete_tasks(%s)", (Jsonb([
                    {"run_id": str(r), "step_slug": s, "task_index": i, "output": {}} for r, s, i in tasks[k:k + 10]]),))

        def cpu(work: int, action: Callable[[], object]) -> float:
            before = _cpu_seconds(pid)
            action()
            return work / (_cpu_seconds(pid) - before)

        for i in range(10):  # warm-up: whole runs
            conn.execute("SELECT count(*) FROM pgflow.start_flow(%s, %s)", (FLOW, Jsonb({"warm": i})))
        for _ in range(3):
            complete_one(claim_all())
        conn.execute("ANALYZE")

        rates = {
            "start_flow": cpu(runs, lambda: [conn.execute("SELECT count(*) FROM pgflow.start_flow(%s, %s)",
                                                          (FLOW, Jsonb({"i": i}))) for i in range(runs)]),
            "start_flows": cpu(runs, lambda: [conn.execute("SELECT count(*) FROM pgflow.start_flows(%s, %s)",
                                                           (FLOW, Jsonb([{"i": i} for i in range(50)])))
                                              for _ in range(runs // 50)]),
        }
        first = claim_all()
        rates["complete_task"] = cpu(len(first), lambda: complete_one(first))
        second = [t for t in claim_all() if t[1] == "b"]
        rates["complete_tasks"] = cpu(len(second), lambda: complete_batches(second))
        waiting = conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE step_slug = 'c' AND status = 'queued'").fetchone()[0]
        if len(first) != 2 * runs or waiting != len(second):
            raise RuntimeError(f"claimed {len(first)} a/b tasks and completed {len(second)} b tasks, {waiting} c tasks wait")
    return rates


def run(ctx: Context) -> list[Result]:
    runs = ctx.size(200, minimum=50) // 50 * 50
    samples: dict[str, list[float]] = {k: [] for k in ("start_flow", "start_flows", "complete_task", "complete_tasks")}
    for rep in range(ctx.repeat):
        for key, value in _sample(ctx, runs).items():
            samples[key].append(value)
        ctx.log(f"repetition {rep + 1}: " + ", ".join(f"{k} {v[-1]:.0f}/s" for k, v in samples.items()))
    details = {"runs": runs, "clock": "backend CPU (schedstat)"}
    return [
        Result("start_flow, one run per call", "runs/CPU s", samples["start_flow"], work=runs, details=details),
        Result("start_flows, 50 runs per call", "runs/CPU s", samples["start_flows"], work=runs,
               baseline="start_flow, one run per call", details=details),
        Result("complete_task, one task per call", "tasks/CPU s", samples["complete_task"], work=2 * runs, details=details),
        Result("complete_tasks, 10 tasks per call", "tasks/CPU s", samples["complete_tasks"], work=2 * runs,
               baseline="complete_task, one task per call", details=details),
    ]

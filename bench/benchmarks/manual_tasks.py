"""Manual completion: tasks completed per second through ``pgflow.complete_manual_task`` next to
a worker's ``pgflow.complete_task`` of the same number of already claimed tasks.

Both samples: a fresh database, a flow compiled through the latest protocol with one step
followed by a queue-backed step (``gate`` -> ``after``), N runs started beforehand and ANALYZEd
(not timed). Manual sample: ``gate`` is manual, so N manual tasks wait; timed: one
``complete_manual_task`` per task, autocommit (each call its own transaction), which also starts
``after`` (one PGMQ send per run). Baseline sample: ``gate`` is queue-backed and its N tasks are
read and claimed beforehand (not timed); timed: one ``complete_task`` per task, which archives the
task's message and starts ``after`` the same way. Checked after timing: N ``gate`` tasks
completed and N ``after`` tasks queued.

Samples are interleaved (baseline, manual, baseline, ...), ``ctx.repeat`` times each. The goal
(issue 12): manual completion costs no more than a worker's completion, ratio >= 1.0x within the
spread.
"""

from __future__ import annotations

import uuid

import psycopg

from bench.core import Context, Result, timed
from pgflow_cli.worker import Flow
from pgflow_cli.worker.protocol import LATEST

FLOW = "benchManual"


def _noop(value, ctx):
    return None


def sample(ctx: Context, tasks: int, *, manual: bool) -> float:
    protocol = LATEST()
    gate = {"manual": True} if manual else {"handler": _noop}
    flow = Flow(FLOW).step("gate", **gate).step("after", _noop, depends_on=["gate"])
    queue = protocol.queue_name(FLOW, None)
    with ctx.database("manual" if manual else "worker_complete") as conninfo, \
            psycopg.connect(conninfo, autocommit=True) as conn:
        protocol.compile(conn, FLOW, flow.shape(), None)
        conn.execute("SELECT count(*) FROM generate_series(1, %s) AS i, "
                     "LATERAL pgflow.start_flow(%s, jsonb_build_object('i', i))", (tasks, FLOW))
        if not manual:
            worker_id = str(uuid.uuid4())
            protocol.register(conn, worker_id=worker_id, function_name="bench-manual", queue_name=queue,
                              flow_slug=FLOW, step_slug=None)
            claimed = 0
            while claimed < tasks:
                ids = protocol.read(conn, queue_name=queue, vt=300, qty=100, max_poll_seconds=1, poll_interval_ms=10)
                claimed += len(protocol.claim(conn, flow_slug=FLOW, step_slug=None, queue_name=queue,
                                              message_ids=ids, worker_id=worker_id).claimed)
        conn.execute("ANALYZE")
        runs = [r[0] for r in conn.execute("SELECT run_id FROM pgflow.runs ORDER BY run_id").fetchall()]
        call = ("SELECT 1 FROM pgflow.complete_manual_task(%s, 'gate', 0, '{}')" if manual
                else "SELECT 1 FROM pgflow.complete_task(%s, 'gate', 0, '{}')")

        def loop() -> None:
            for run_id in runs:
                conn.execute(call, (run_id,))

        seconds, _ = timed(loop)
        done, queued = conn.execute(
            "SELECT count(*) FILTER (WHERE step_slug = 'gate' AND status = 'completed'), "
            "count(*) FILTER (WHERE step_slug = 'after' AND status = 'queued') FROM pgflow.step_tasks").fetchone()
        if (done, queued) != (tasks, tasks):
            raise RuntimeError(f"{done} gate tasks completed and {queued} after tasks queued, expected {tasks}")
    return tasks / seconds


def run(ctx: Context) -> list[Result]:
    tasks = ctx.size(1000)
    worker: list[float] = []
    manual: list[float] = []
    for i in range(ctx.repeat):
        worker.append(sample(ctx, tasks, manual=False))
        manual.append(sample(ctx, tasks, manual=True))
        ctx.log(f"manual_tasks {i + 1}/{ctx.repeat}: complete_task {worker[-1]:.0f} tasks/s, "
                f"complete_manual_task {manual[-1]:.0f} tasks/s")
    baseline = "complete_task of claimed tasks (worker)"
    details = {"connections": 1, "transaction": "one per call", "protocol": LATEST.version}
    return [
        Result(baseline, "tasks/s", worker, work=tasks, details=details),
        Result("complete_manual_task", "tasks/s", manual, work=tasks, baseline=baseline,
               details={**details, "goal": ">= 1.0x within the spread"}),
    ]

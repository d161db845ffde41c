"""End-to-end runs per second: a 3-step linear flow with no-op handlers driven by one reference
Worker (default settings), next to a bare PGMQ loop doing the queue work those runs need.

Worker sample (fresh database): the worker is started and N/3 warm-up runs go through it, then
the database is ANALYZEd (steady-state statistics, as a live database has them). Timed: N runs
are started in one statement while the idle worker polls; the clock stops when the last run is
completed (the driver checks every 10 ms).

Baseline sample (same server, fresh database, same warm-up and ANALYZE): N messages are sent,
then one connection reads batches of 10 and, per message, archives it and sends the next
stage's message in one statement, for 3 stages: 3N sends, 3N reads, 3N archives, the minimal
queue work of N three-step runs. Its rate is reported in run equivalents (3 messages = 1 run).

The two are measured alternately, ``ctx.repeat`` times each.
"""

from __future__ import annotations

import time

import psycopg
from psycopg.types.json import Jsonb

from bench.core import Context, Result, timed
from pgflow_cli.worker import Flow, Worker

FLOW = "benchLinear"
STAGES = 3
BARE_BATCH = 10


def _noop(value, ctx):
    return None


def linear_flow() -> Flow:
    return (
        Flow(FLOW)
        .step("first", _noop)
        .step("second", _noop, depends_on=["first"])
        .step("third", _noop, depends_on=["second"])
    )


def worker_sample(ctx: Context, runs: int) -> tuple[float, dict]:
    with ctx.database("e2e_worker") as conninfo:
        worker = Worker(linear_flow(), conninfo, function_name="bench-worker", application_name="pgflow-bench")
        worker.start()
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                def drive(n: int) -> None:
                    conn.execute(
                        "SELECT count(*) FROM generate_series(1, %s) AS i, "
                        "LATERAL pgflow.start_flow(%s, jsonb_build_object('i', i))", (n, FLOW))
                    while conn.execute("SELECT EXISTS (SELECT 1 FROM pgflow.runs WHERE status = 'started')").fetchone()[0]:
                        time.sleep(0.01)

                drive(max(1, runs // 3))  # warm-up
                conn.execute("ANALYZE")
                seconds, _ = timed(lambda: drive(runs))
                failed = conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE status <> 'completed' "
                                      "OR attempts_count <> 1").fetchone()[0]
                if failed:
                    raise RuntimeError(f"{failed} task(s) did not complete on their first attempt")
        finally:
            worker.stop("benchmark done")
            worker.join(120)
        settings = {k: getattr(worker, k) for k in ("max_concurrent", "batch_size", "max_poll_seconds", "poll_interval_ms")}
        return runs / seconds, settings


def bare_sample(ctx: Context, runs: int) -> float:
    queue = "bench_bare"
    with ctx.database("e2e_bare") as conninfo, psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT pgmq.create(%s)", (queue,))

        def loop(runs: int) -> None:
            conn.execute("SELECT pgmq.send_batch(%s, array_agg(jsonb_build_object('run', i, 'stage', 1))) "
                         "FROM generate_series(1, %s) AS i", (queue, runs))
            done = 0
            while done < runs:
                batch = conn.execute("SELECT msg_id, message FROM pgmq.read(%s, 30, %s)", (queue, BARE_BATCH)).fetchall()
                if not batch:
                    raise RuntimeError(f"bare queue ran dry after {done} of {runs} runs")
                for msg_id, body in batch:
                    if body["stage"] < STAGES:
                        conn.execute("SELECT pgmq.archive(%s, %s::bigint), pgmq.send(%s, %s)",
                                     (queue, msg_id, queue, Jsonb({"run": body["run"], "stage": body["stage"] + 1})))
                    else:
                        conn.execute("SELECT pgmq.archive(%s, %s::bigint)", (queue, msg_id))
                        done += 1

        warm = max(1, runs // 3)
        loop(warm)
        conn.execute("ANALYZE")
        seconds, _ = timed(lambda: loop(runs))
        archived = conn.execute("SELECT count(*) FROM pgmq.a_bench_bare").fetchone()[0]
        if archived != (warm + runs) * STAGES:
            raise RuntimeError(f"bare loop archived {archived} messages, expected {(warm + runs) * STAGES}")
    return runs / seconds


def run(ctx: Context) -> list[Result]:
    runs = ctx.size(300)
    worker_rates: list[float] = []
    bare_rates: list[float] = []
    settings: dict = {}
    for i in range(ctx.repeat):
        bare_rates.append(bare_sample(ctx, runs))
        rate, settings = worker_sample(ctx, runs)
        worker_rates.append(rate)
        ctx.log(f"end_to_end {i + 1}/{ctx.repeat}: worker {rate:.1f} runs/s, bare {bare_rates[-1]:.1f} run-equivalents/s")
    bare = "bare PGMQ loop (3 msgs/run)"
    return [
        Result(bare, "runs/s", bare_rates, work=runs,
               details={"connections": 1, "read_batch": BARE_BATCH, "messages_per_run": STAGES}),
        Result("reference Worker, 3-step no-op flow", "runs/s", worker_rates, work=runs, baseline=bare,
               details={"workers": 1, **settings}),
    ]

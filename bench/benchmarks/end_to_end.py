"""End-to-end runs per second: a 3-step linear flow with no-op handlers driven by one reference
Worker (default settings), next to a bare PGMQ loop doing the queue work those runs need.

Worker sample (fresh database): a worker starts (compiles the flow, registers) and takes N/3
warm-up runs through it, so its pooled connections have their plans and caches, as a
long-running worker's have; the database is ANALYZEd (steady-state statistics, as a live
database has them) while the worker idles. Then N runs are started in one transaction (not
timed). Timed: from that transaction's commit (the moment the worker can see the first
messages) until the driver, checking every 10 ms, sees the last run completed. So only the
draining of N started runs by a warm worker is timed: claims, handlers and reports, not
``start_flow`` and not the worker's start-up. The worker's counters (average read, report
batches) are the timed window's.

Baseline sample (same server, fresh database): N/3 warm-up runs on the same connection, ANALYZE,
then N first-stage messages sent in one statement (not timed). Timed: one connection reads
batches of 10 and, per message, archives it and sends the next stage's message in one statement
(the last stage only archives), until every run has passed 3 stages: 2N sends, 3N reads, 3N
archives, the queue work of draining N started three-step runs (the worker does the same queue
work: each task's message is read, archived, and the next step's message sent). Its rate is
reported in run equivalents.

Also reported against the same baseline: the worker with one report call per task and reads
capped at its free slots (``batch_reports=False, prefetch=False``; the worker before issue 18).
The worker uses batched reports only where the database has ``complete_tasks`` (the JSON
records ``reports_batched``).

The three are measured alternately (baseline, worker, worker without batching, ...),
``ctx.repeat`` times each. The machine's load moves all three; read the paired ratio.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from bench.core import Context, Result, timed
from pgflow_cli.worker import Flow, Worker, WorkerOptions

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


def worker_sample(ctx: Context, runs: int, **options: Any) -> tuple[float, dict]:
    with ctx.database("e2e_worker") as conninfo, psycopg.connect(conninfo, autocommit=True) as conn:
        def start(n: int) -> None:
            conn.execute("SELECT count(*) FROM generate_series(1, %s) AS i, "
                         "LATERAL pgflow.start_flow(%s, jsonb_build_object('i', i))", (n, FLOW))

        def drained() -> None:
            while conn.execute("SELECT EXISTS (SELECT 1 FROM pgflow.runs WHERE status = 'started')").fetchone()[0]:
                time.sleep(0.01)

        worker = Worker(linear_flow(), conninfo, function_name="bench-worker",
                        options=WorkerOptions(application_name="pgflow-bench", **options))
        try:
            worker.start()  # compiles the flow, registers, polls
            start(max(1, runs // 3))  # warm-up: the worker's connections cache their plans
            drained()
            conn.execute("ANALYZE")
            before = worker.stats.snapshot()
            with conn.transaction():
                start(runs)
                began = time.perf_counter()  # the worker sees the runs from the commit on
            drained()
            seconds = time.perf_counter() - began
            settle = time.monotonic() + 5  # the last report's counter moves just after its call returns
            while worker.stats.snapshot()["completed"] - before["completed"] < runs * STAGES \
                    and time.monotonic() < settle:
                time.sleep(0.01)
            after = worker.stats.snapshot()
        finally:
            worker.stop("benchmark done")
            worker.join(120)
        failed = conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE status <> 'completed' "
                              "OR attempts_count <> 1").fetchone()[0]
        if failed:
            raise RuntimeError(f"{failed} task(s) did not complete on their first attempt")
        settings = {k: getattr(worker.options, k) for k in ("max_concurrent", "batch_size", "max_poll_seconds",
                                                              "poll_interval_ms", "batch_reports", "prefetch")}
        settings["reports_batched"] = worker.reports_batched
        stats = {k: after[k] - before.get(k, 0) for k in after}
        if stats["completed"] != runs * STAGES:
            raise RuntimeError(f"the timed window completed {stats['completed']} tasks, expected {runs * STAGES}")
        settings["average_read"] = round(stats["messages_read"] / max(1, stats["polls"]), 2)
        settings["report_batches"], settings["batch_reported"] = stats["report_batches"], stats["batch_reported"]
        return runs / seconds, settings


def bare_sample(ctx: Context, runs: int) -> float:
    queue = "bench_bare"
    with ctx.database("e2e_bare") as conninfo, psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT pgmq.create(%s)", (queue,))

        def send(runs: int) -> None:
            conn.execute("SELECT pgmq.send_batch(%s, array_agg(jsonb_build_object('run', i, 'stage', 1))) "
                         "FROM generate_series(1, %s) AS i", (queue, runs))

        def loop(runs: int) -> None:
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
        send(warm)
        loop(warm)
        conn.execute("ANALYZE")
        send(runs)
        seconds, _ = timed(lambda: loop(runs))
        archived = conn.execute("SELECT count(*) FROM pgmq.a_bench_bare").fetchone()[0]
        if archived != (warm + runs) * STAGES:
            raise RuntimeError(f"bare loop archived {archived} messages, expected {(warm + runs) * STAGES}")
    return runs / seconds


def run(ctx: Context) -> list[Result]:
    runs = ctx.size(300)
    worker_rates: list[float] = []
    plain_rates: list[float] = []
    bare_rates: list[float] = []
    settings: dict = {}
    plain: dict = {}
    for i in range(ctx.repeat):
        bare_rates.append(bare_sample(ctx, runs))
        rate, settings = worker_sample(ctx, runs)
        worker_rates.append(rate)
        rate, plain = worker_sample(ctx, runs, batch_reports=False, prefetch=False)
        plain_rates.append(rate)
        ctx.log(f"end_to_end {i + 1}/{ctx.repeat}: worker {worker_rates[-1]:.1f} runs/s (reports batched: "
                f"{settings['reports_batched']}, average read {settings['average_read']}), without batching "
                f"{plain_rates[-1]:.1f} (average read {plain['average_read']}), bare {bare_rates[-1]:.1f} "
                "run-equivalents/s")
    bare = "bare PGMQ loop (3 msgs/run)"
    return [
        Result(bare, "runs/s", bare_rates, work=runs,
               details={"connections": 1, "read_batch": BARE_BATCH, "messages_per_run": STAGES}),
        Result("reference Worker, 3-step no-op flow", "runs/s", worker_rates, work=runs, baseline=bare,
               details={"workers": 1, "goal": ">= 0.5x", **settings}),
        Result("reference Worker, one report call per task, reads capped at free slots", "runs/s", plain_rates,
               work=runs, baseline=bare, details={"workers": 1, **plain}),
    ]

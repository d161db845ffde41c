"""Cross-step starvation: the fast step's queue wait with one shared queue versus private step queues.

One flow with two root steps: ``slow`` (the handler sleeps ``SLOW_SECONDS``) and ``fast`` (returns
at once). A feeder starts runs at a steady ``RATE`` per second for ``DURATION`` seconds; every run
creates one slow and one fast task. The same total capacity serves both modes, two reference
``Worker`` objects with ``CONCURRENCY`` handler slots each:

* **shared**: a plain flow; both workers poll the flow's one queue and take slow and fast tasks alike;
* **step queues**: ``with_step_queues(flow)``; one worker serves ``slow`` on its queue, the other
  ``fast`` on its queue.

Slow demand is ``RATE x SLOW_SECONDS`` = 12 busy slots, more than the 8 of both workers together
and the 4 of the slow pool: the slow step is saturated in both modes.

Measured: the fast tasks' queue wait, ``started_at - queued_at`` of ``pgflow.step_tasks`` (a task
not started when the window closes counts with its wait so far), over the runs started after the
first ``WARMUP`` seconds; reported as p50 and p99 in milliseconds (**lower is better**; the
ratio column is loaded / idle). Idle: the same mode and feed with a slow handler that returns at
once. Each repetition measures idle and saturated for both modes, interleaved, on fresh databases.
Goal (issue 9): with step queues the fast p99 stays within 2x of its idle value.
"""

from __future__ import annotations

import time

import psycopg

from bench.benchmarks._starvation import WORKER_SETTINGS, compare, feed, percentile, queue_waits, running
from bench.core import Context, Result
from pgflow_cli.worker import Flow, Worker, WorkerOptions, with_step_queues

RATE = 8.0
"""Runs started per second."""
SLOW_SECONDS = 1.5
DURATION = 8.0
WARMUP = 2.0
CONCURRENCY = WORKER_SETTINGS["max_concurrent"]


def _flow(slug: str, slow_seconds: float) -> Flow:
    def slow(value, ctx):
        time.sleep(slow_seconds)
        return None

    def fast(value, ctx):
        return None

    return Flow(slug).step("slow", slow).step("fast", fast)


def _workers(mode: str, conninfo: str, slow_seconds: float) -> list[Worker]:
    common = dict(WORKER_SETTINGS, application_name="pgflow-bench")
    if mode == "shared":
        flow = _flow("starveShared", slow_seconds)
        return [Worker(flow, conninfo, function_name="bench-shared", options=WorkerOptions(**common)) for _ in range(2)]
    queued = with_step_queues(_flow("starveSteps", slow_seconds))
    return [Worker(queued, conninfo, function_name=f"bench-{step}", step_slug=step, options=WorkerOptions(**common))
            for step in ("slow", "fast")]


def sample(ctx: Context, mode: str, loaded: bool) -> tuple[float, float, int]:
    """One feed window; returns (p50 ms, p99 ms, fast tasks measured)."""
    slow_seconds = SLOW_SECONDS if loaded else 0.0
    with ctx.database(f"starve_{mode}_{'load' if loaded else 'idle'}") as conninfo:
        workers = _workers(mode, conninfo, slow_seconds)
        flow_slug = workers[0].flow.slug
        with running(workers), psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("ANALYZE")
            run_ids = feed(RATE, DURATION, lambda n: conn.execute(
                "SELECT run_id::text FROM pgflow.start_flow(%s, '{}')", (flow_slug,)).fetchone()[0])
            measured = [r for t, r in run_ids if t >= WARMUP]
            waits = queue_waits(conn, ["fast"], measured)
            if len(waits) != len(measured):
                raise RuntimeError(f"{mode}: {len(measured)} runs but {len(waits)} fast tasks")
            bad = conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE status = 'failed'").fetchone()[0]
            if bad:
                raise RuntimeError(f"{mode}: {bad} task(s) failed")
    return percentile(waits, 0.5), percentile(waits, 0.99), len(waits)


def run(ctx: Context) -> list[Result]:
    details = {"rate_runs_per_s": RATE, "slow_seconds": SLOW_SECONDS, "duration_s": DURATION, "warmup_s": WARMUP,
               "workers": 2, "concurrency_per_worker": CONCURRENCY, "lower_is_better": True}
    return compare(ctx, sample, title="starvation", measured="fast-step queue wait", busy="slow", details=details)

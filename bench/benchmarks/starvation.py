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

import statistics
import time

import psycopg

from bench.core import Context, Result
from pgflow_cli.worker import Flow, Worker, with_step_queues

RATE = 8.0
"""Runs started per second."""
SLOW_SECONDS = 1.5
DURATION = 8.0
WARMUP = 2.0
CONCURRENCY = 4
WORKER_SETTINGS = {"max_concurrent": CONCURRENCY, "batch_size": CONCURRENCY, "max_poll_seconds": 2,
                   "poll_interval_ms": 50, "heartbeat_interval": 2.0, "drain_timeout": 10.0}


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
        return [Worker(flow, conninfo, function_name="bench-shared", **common) for _ in range(2)]
    queued = with_step_queues(_flow("starveSteps", slow_seconds))
    return [Worker(queued, conninfo, function_name=f"bench-{step}", step_slug=step, **common)
            for step in ("slow", "fast")]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def sample(ctx: Context, mode: str, loaded: bool) -> tuple[float, float, int]:
    """One feed window; returns (p50 ms, p99 ms, fast tasks measured)."""
    slow_seconds = SLOW_SECONDS if loaded else 0.0
    with ctx.database(f"starve_{mode}_{'load' if loaded else 'idle'}") as conninfo:
        workers = _workers(mode, conninfo, slow_seconds)
        flow_slug = workers[0].flow.slug
        for worker in workers:
            worker.start()
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute("ANALYZE")
                started = time.monotonic()
                run_ids: list[tuple[float, str]] = []
                n = 0
                while True:
                    due = started + n / RATE
                    now = time.monotonic()
                    if due - started >= DURATION:
                        break
                    if due > now:
                        time.sleep(due - now)
                    run_id = conn.execute("SELECT run_id::text FROM pgflow.start_flow(%s, '{}')", (flow_slug,)).fetchone()[0]
                    run_ids.append((time.monotonic() - started, run_id))
                    n += 1
                measured = [r for t, r in run_ids if t >= WARMUP]
                waits = [float(w) for (w,) in conn.execute(
                    "SELECT extract(epoch FROM coalesce(started_at, clock_timestamp()) - queued_at) * 1000 "
                    "FROM pgflow.step_tasks WHERE step_slug = 'fast' AND run_id = ANY(%s::uuid[])",
                    (measured,)).fetchall()]
                if len(waits) != len(measured):
                    raise RuntimeError(f"{mode}: {len(measured)} runs but {len(waits)} fast tasks")
                bad = conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE status = 'failed'").fetchone()[0]
                if bad:
                    raise RuntimeError(f"{mode}: {bad} task(s) failed")
        finally:
            for worker in workers:
                worker.stop("benchmark window over")
            for worker in workers:
                worker.join(60)
    return _percentile(waits, 0.5), _percentile(waits, 0.99), len(waits)


def run(ctx: Context) -> list[Result]:
    repeat = max(1, min(ctx.repeat, 3))
    modes = ("shared", "step")
    samples: dict[tuple[str, bool, str], list[float]] = {}
    counts: dict[tuple[str, bool], list[int]] = {}
    for i in range(repeat):
        for loaded in (False, True):
            for mode in modes:
                p50, p99, n = sample(ctx, mode, loaded)
                samples.setdefault((mode, loaded, "p50"), []).append(p50)
                samples.setdefault((mode, loaded, "p99"), []).append(p99)
                counts.setdefault((mode, loaded), []).append(n)
                ctx.log(f"starvation {i + 1}/{repeat} {mode:6} {'saturated' if loaded else 'idle':9} "
                        f"fast wait p50 {p50:7.0f} ms  p99 {p99:7.0f} ms  ({n} tasks)")
    label = {"shared": "one shared queue", "step": "private step queues"}
    details = {"rate_runs_per_s": RATE, "slow_seconds": SLOW_SECONDS, "duration_s": DURATION, "warmup_s": WARMUP,
               "workers": 2, "concurrency_per_worker": CONCURRENCY, "lower_is_better": True}
    results: list[Result] = []
    for mode in modes:
        for stat in ("p50", "p99"):
            idle = f"fast-step queue wait {stat}, {label[mode]}, slow idle"
            results.append(Result(idle, "ms", samples[(mode, False, stat)], work=int(statistics.median(counts[(mode, False)])),
                                  details=details))
            results.append(Result(f"fast-step queue wait {stat}, {label[mode]}, slow saturated", "ms",
                                  samples[(mode, True, stat)], work=int(statistics.median(counts[(mode, True)])),
                                  baseline=idle, details=details))
    return results

"""Tasks per second of an ``async def`` handler on the worker's event loop, next to a ``def``
handler on its thread pool doing the same wait, and the ideal rate for the slots.

The work: one run of a flow whose only step is a root map over 2,000 elements (2,000 tasks);
every handler call waits 50 ms (``await asyncio.sleep(0.05)`` or ``time.sleep(0.05)``) and
returns its element. One reference ``Worker`` with 100 slots (``max_concurrent`` 100,
``batch_size`` 100, batched reports) serves it. The ideal rate is slots / handler time =
100 / 0.05 s = 2,000 tasks/s: what 100 slots could do if claims and reports cost nothing.

Sample (fresh database per sample): the worker starts (compiles, registers) and takes a 200-task
warm-up run, so its pooled connections have their plans and its capacity estimate has seen the
handlers' duration. Then the 2,000-task run is started in one transaction (not timed). Timed:
from that transaction's commit until the driver, checking every 10 ms, sees the run completed.

Both kinds are measured alternately (thread pool, async, thread pool, ...), ``ctx.repeat`` times
each. The ideal rate is computed, not measured: its "samples" are the same number repeated. Issue
25's goal: the async handler reaches >= 0.8x of the ideal rate.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg

from bench.core import Context, Result, start_run, wait_run_ended
from pgflow_cli.worker import Flow, Worker, WorkerOptions

FLOW = "benchAsync"
TASKS = 2000
WARMUP = 200
SLOTS = 100
HANDLER_SECONDS = 0.05
IDEAL = SLOTS / HANDLER_SECONDS


async def _async_wait(item: Any, ctx: Any) -> Any:
    await asyncio.sleep(HANDLER_SECONDS)
    return item


def _thread_wait(item: Any, ctx: Any) -> Any:
    time.sleep(HANDLER_SECONDS)
    return item


def sample(ctx: Context, tasks: int, handler: Callable[..., Any]) -> tuple[float, dict[str, Any]]:
    """One timed run of ``tasks`` tasks; returns tasks/s and the worker's counters of the window."""
    with ctx.database("async_handlers") as conninfo, psycopg.connect(conninfo, autocommit=True) as conn:
        def start(n: int) -> str:
            return start_run(conn, FLOW, list(range(n)))

        def finished(run_id: str) -> None:
            wait_run_ended(conn, run_id)

        worker = Worker(Flow(FLOW).map("each", handler), conninfo, function_name="bench-async",
                        options=WorkerOptions(max_concurrent=SLOTS, batch_size=SLOTS, application_name="pgflow-bench"))
        try:
            worker.start()
            finished(start(WARMUP))
            before = worker.stats.snapshot()
            with conn.transaction():
                run_id = start(tasks)
                began = time.perf_counter()  # the worker sees the tasks from the commit on
            finished(run_id)
            seconds = time.perf_counter() - began
            settle = time.monotonic() + 5
            while worker.stats.snapshot()["completed"] - before["completed"] < tasks and time.monotonic() < settle:
                time.sleep(0.01)
            after = worker.stats.snapshot()
        finally:
            worker.stop("benchmark done")
            worker.join(120)
        status = conn.execute("SELECT status FROM pgflow.runs WHERE run_id = %s", (run_id,)).fetchone()[0]
        if status != "completed":
            raise RuntimeError(f"the timed run ended {status}")
        not_once = conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE run_id = %s AND attempts_count <> 1",
                                (run_id,)).fetchone()[0]
        if not_once:
            raise RuntimeError(f"{not_once} task(s) needed more than one attempt")
        window = {k: after[k] - before.get(k, 0) for k in ("polls", "messages_read", "claimed", "report_batches",
                                                           "batch_reported")}
        return tasks / seconds, window


def run(ctx: Context) -> list[Result]:
    tasks = ctx.size(TASKS)
    threads: list[float] = []
    coroutines: list[float] = []
    details: dict[str, Any] = {}
    for i in range(ctx.repeat):
        rate, details["thread_pool_window"] = sample(ctx, tasks, _thread_wait)
        threads.append(rate)
        rate, details["async_window"] = sample(ctx, tasks, _async_wait)
        coroutines.append(rate)
        ctx.log(f"async_handlers {i + 1}/{ctx.repeat}: async def {coroutines[-1]:.0f} tasks/s "
                f"({coroutines[-1] / IDEAL:.2f}x of ideal {IDEAL:.0f}), thread pool {threads[-1]:.0f} tasks/s "
                f"({threads[-1] / IDEAL:.2f}x)")
    versus = statistics.median(a / t for a, t in zip(coroutines, threads, strict=True))
    ideal = f"ideal: {SLOTS} slots / {HANDLER_SECONDS * 1000:.0f} ms handler (computed)"
    common = {"slots": SLOTS, "batch_size": SLOTS, "handler_seconds": HANDLER_SECONDS, "tasks": tasks}
    return [
        Result(ideal, "tasks/s", [IDEAL] * ctx.repeat, work=tasks, details={"computed": True, **common}),
        Result(f"def handler, time.sleep({HANDLER_SECONDS * 1000:.0f} ms), thread pool", "tasks/s", threads,
               work=tasks, baseline=ideal, details={**common, "window": details.get("thread_pool_window")}),
        Result(f"async def handler, asyncio.sleep({HANDLER_SECONDS * 1000:.0f} ms), worker's event loop", "tasks/s",
               coroutines, work=tasks, baseline=ideal,
               details={**common, "goal": ">= 0.8x of ideal", "paired_vs_thread_pool": round(versus, 3),
                        "window": details.get("async_window")}),
    ]

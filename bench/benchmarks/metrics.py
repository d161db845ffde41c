"""What metrics cost: a worker's throughput with its Prometheus endpoint on and off, and the time of
one exporter scrape on a database of 1,000 and of 100,000 finished runs.

Worker. One run of a flow whose only step is a root map over 2,000 elements, no-op handler; one
reference ``Worker`` (``max_concurrent`` 10, ``batch_size`` 10, batched reports) drains it. Sample
(fresh database each): the worker starts and drains a 200-task warm-up run, then the timed run is
started in one transaction; timed from its commit until the driver (checking every 10 ms) sees the
run completed. With metrics on (``metrics_port=0``) a scraper thread reads ``/metrics`` over HTTP
once a second during the whole sample, so the exposition's cost is in it too. Off and on are
measured alternately (off, on, off, ...), ``ctx.repeat`` times each. Issue 27's goal: on >= 0.97x.
The same window's CPU time of the whole process (``time.process_time``: every thread, the driver's
checks included) per 1,000 tasks is reported too (**lower is better**): on a machine whose load
moves the wall-clock rate by more than the few percent in question, the CPU the metrics add is the
steadier figure.

Exporter. The history databases of ``claim_scaling`` (1,000 runs taken through read, claim and
complete, then copied 99 times for 100,000; ``ANALYZE``), plus 100 started runs queued. Timed: one
HTTP GET of ``/metrics`` from an in-process exporter with ``cache_seconds=0`` (so every scrape reads
the snapshot: the coverage, status, fence and ledger queries, then the exposition), after one
untimed scrape; ``SCRAPES`` scrapes per sample, their median. The 100k time divided by the 1k time
is compared with 100 (linear in the runs).
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
import urllib.request
from typing import Any

import psycopg

from bench.benchmarks.claim_scaling import history_database
from bench.core import Context, Result, alternate, start_run, wait_run_ended
from pgflow_cli import db
from pgflow_cli.operations import exporter as exporter_op
from pgflow_cli.worker import Flow, ProtocolV2, Worker, WorkerOptions

FLOW = "benchMetrics"
TASKS = 2000
WARMUP = 200
SCRAPES = 7
QUEUED_RUNS = 100


def _noop(item: Any, ctx: Any) -> Any:
    return item


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        body: bytes = response.read()
        return body


def worker_sample(ctx: Context, tasks: int, metrics: bool, cpu: list[float]) -> float:
    """Tasks/s of one timed run with the worker's metrics on or off; appends to ``cpu`` the process's
    CPU milliseconds per 1,000 tasks of the same window (every thread of the worker, the driver's
    checks and the scraper included: the same in both but the scraper)."""
    with ctx.database("metrics_worker") as conninfo, psycopg.connect(conninfo, autocommit=True) as conn:
        worker = Worker(Flow(FLOW).map("each", _noop), conninfo, function_name="bench-metrics",
                        options=WorkerOptions(max_concurrent=10, batch_size=10, application_name="pgflow-bench",
                                              metrics_port=0 if metrics else None))
        done = threading.Event()
        scraper: threading.Thread | None = None
        try:
            worker.start()
            if worker.metrics_address is not None:
                url = "http://{}:{}/metrics".format(*worker.metrics_address)

                def scrape() -> None:
                    while not done.wait(1.0):
                        _get(url)

                scraper = threading.Thread(target=scrape, daemon=True)
                scraper.start()
            wait_run_ended(conn, start_run(conn, FLOW, list(range(WARMUP))))
            with conn.transaction():
                run_id = start_run(conn, FLOW, list(range(tasks)))
                began, began_cpu = time.perf_counter(), time.process_time()
            wait_run_ended(conn, run_id)
            seconds = time.perf_counter() - began
            cpu.append((time.process_time() - began_cpu) * 1000 * 1000 / tasks)
        finally:
            done.set()
            if scraper is not None:
                scraper.join(10)
            worker.stop("benchmark done")
            worker.join(120)
        if conn.execute("SELECT status FROM pgflow.runs WHERE run_id = %s", (run_id,)).fetchone()[0] != "completed":
            raise RuntimeError("the timed run did not complete")
        return tasks / seconds


def scrape_seconds(ctx: Context, runs: int) -> tuple[float, int]:
    """Median seconds of one exporter scrape (cache off) on ``runs`` finished runs; and the body's size."""
    with contextlib.ExitStack() as stack:
        s = history_database(ctx, stack, ProtocolV2(), None, runs)
        s.start_runs(QUEUED_RUNS)
        s.conn.execute("ANALYZE")
        target = db.Target(s.conn.info.dsn, "bench")
        served = exporter_op.Exporter(lambda: db.connect(target, application_name="pgflow-bench-exporter"),
                                      host="127.0.0.1", port=0, cache_seconds=0)
        try:
            url = f"{served.server.url}/metrics"
            body = _get(url)
            if b"pgflow_exporter_up 1.0" not in body:
                raise RuntimeError("the exporter could not read the database")
            times = []
            for _ in range(SCRAPES):
                began = time.perf_counter()
                _get(url)
                times.append(time.perf_counter() - began)
        finally:
            served.close()
        return statistics.median(times), len(body)


def run(ctx: Context) -> list[Result]:
    tasks = ctx.size(TASKS)
    cpu_off: list[float] = []
    cpu_on: list[float] = []
    off, on = alternate(ctx, "metrics", lambda: worker_sample(ctx, tasks, False, cpu_off),
                        lambda: worker_sample(ctx, tasks, True, cpu_on),
                        lambda a, b: f"worker metrics off {a:.0f} tasks/s, on {b:.0f} tasks/s ({b / a:.3f}x)")
    small_runs, big_runs = ctx.size(1000, 1000), ctx.size(100_000, 2000)
    sizes: dict[str, int] = {}

    def scrape_ms(runs: int, key: str) -> float:
        seconds, sizes[key] = scrape_seconds(ctx, runs)
        return seconds * 1000

    small, big = alternate(ctx, "metrics", lambda: scrape_ms(small_runs, "small_body_bytes"),
                           lambda: scrape_ms(big_runs, "big_body_bytes"),
                           lambda a, b: f"exporter scrape {a:.1f} ms at {small_runs} runs, {b:.1f} ms at {big_runs} "
                           f"runs ({b / a:.2f}x for {big_runs / small_runs:.0f}x the runs)")
    off_label = f"worker, metrics off: {tasks}-task map, no-op handler, 10 slots"
    small_label = f"exporter scrape (cache off), {small_runs} finished runs"
    growth = big_runs / small_runs
    paired = statistics.median(b / s for b, s in zip(big, small, strict=True))
    cpu_label = "worker process CPU per 1,000 tasks, metrics off"
    return [
        Result(off_label, "tasks/s", off, work=tasks),
        Result("worker, metrics on (scraped every second)", "tasks/s", on, work=tasks, baseline=off_label,
               details={"goal": ">= 0.97x"}),
        Result(cpu_label, "CPU ms", cpu_off, work=tasks),
        Result("worker process CPU per 1,000 tasks, metrics on", "CPU ms", cpu_on, work=tasks, baseline=cpu_label,
               details={"lower_is_better": True}),
        Result(small_label, "ms", small, details={"queued_runs": QUEUED_RUNS, **sizes}),
        Result(f"exporter scrape (cache off), {big_runs} finished runs", "ms", big, baseline=small_label,
               details={"runs_ratio": growth, "ratio_to_linear": round(paired / growth, 4),
                        "goal": f"<= {growth:.0f}x (linear in the runs)", "queued_runs": QUEUED_RUNS, **sizes}),
    ]

"""What the two starvation benchmarks share (``starvation.py``, ``ingest_starvation.py``).

Both feed runs at a steady rate for a fixed window while reference workers serve them, measure the
queue wait (``started_at - queued_at``) of the steps that should not wait, and compare a shared
queue with private step queues, each saturated against idle. The leading underscore keeps
``bench.run`` from running this module as a benchmark.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from bench.core import Context, Result
from pgflow_cli.worker import Worker

WORKER_SETTINGS = {"max_concurrent": 4, "batch_size": 4, "max_poll_seconds": 2,
                   "poll_interval_ms": 50, "heartbeat_interval": 2.0, "drain_timeout": 10.0}
"""Reference worker settings of both benchmarks (4 handler slots unless a benchmark says otherwise)."""

MODES = ("shared", "step")
LABEL = {"shared": "one shared queue", "step": "private step queues"}


def percentile(values: list[float], q: float) -> float:
    """The value at quantile ``q`` (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@contextmanager
def running(workers: Sequence[Worker]) -> Iterator[None]:
    """Start ``workers``; at the end stop them all, then wait up to 60 s for each."""
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        for worker in workers:
            worker.stop("benchmark window over")
        for worker in workers:
            worker.join(60)


def feed(rate: float, duration: float, start: Callable[[int], str]) -> list[tuple[float, str]]:
    """Call ``start(n)`` (n = 0, 1, ...; it starts one run and returns its id) ``rate`` times a second
    for ``duration`` seconds; returns (seconds since the first start, run id) per run."""
    started = time.monotonic()
    run_ids: list[tuple[float, str]] = []
    n = 0
    while (due := started + n / rate) - started < duration:
        if due > time.monotonic():
            time.sleep(max(0.0, due - time.monotonic()))
        run_id = start(n)
        run_ids.append((time.monotonic() - started, run_id))
        n += 1
    return run_ids


def queue_waits(conn: psycopg.Connection, steps: Sequence[str], run_ids: list[str]) -> list[float]:
    """Milliseconds each task of ``steps`` in ``run_ids`` waited in its queue (so far, if not started)."""
    return [float(w) for (w,) in conn.execute(
        "SELECT extract(epoch FROM coalesce(started_at, clock_timestamp()) - queued_at) * 1000 "
        "FROM pgflow.step_tasks WHERE step_slug = ANY(%s) AND run_id = ANY(%s::uuid[])",
        (list(steps), run_ids)).fetchall()]


def compare(ctx: Context, sample: Callable[[Context, str, bool], tuple[float, float, int]], *, title: str,
            measured: str, busy: str, details: dict[str, Any]) -> list[Result]:
    """Run ``sample(ctx, mode, loaded)`` (-> p50 ms, p99 ms, tasks) for both modes, idle then saturated,
    interleaved, up to 3 repetitions; one result per mode and statistic, the saturated one against
    the idle one as baseline.

    Args:
        title: the progress lines' prefix.
        measured: what is measured, in result names (``fast-step queue wait``).
        busy: the step that is saturated, in result names (``slow``).
        details: the results' details.
    """
    repeat = max(1, min(ctx.repeat, 3))
    samples: dict[tuple[str, bool, str], list[float]] = {}
    counts: dict[tuple[str, bool], list[int]] = {}
    for i in range(repeat):
        for loaded in (False, True):
            for mode in MODES:
                p50, p99, n = sample(ctx, mode, loaded)
                samples.setdefault((mode, loaded, "p50"), []).append(p50)
                samples.setdefault((mode, loaded, "p99"), []).append(p99)
                counts.setdefault((mode, loaded), []).append(n)
                ctx.log(f"{title} {i + 1}/{repeat} {mode:6} {'saturated' if loaded else 'idle':9} "
                        f"{measured} p50 {p50:7.0f} ms  p99 {p99:7.0f} ms  ({n} tasks)")
    results: list[Result] = []
    for mode in MODES:
        for stat in ("p50", "p99"):
            idle = f"{measured} {stat}, {LABEL[mode]}, {busy} idle"
            results.append(Result(idle, "ms", samples[(mode, False, stat)],
                                  work=int(statistics.median(counts[(mode, False)])), details=details))
            results.append(Result(f"{measured} {stat}, {LABEL[mode]}, {busy} saturated", "ms",
                                  samples[(mode, True, stat)], work=int(statistics.median(counts[(mode, True)])),
                                  baseline=idle, details=details))
    return results

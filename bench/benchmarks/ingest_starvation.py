"""Starvation on the ingestion application: the fast stages' queue wait while enrichment is saturated.

The Stage 2 starvation benchmark (``starvation.py``) on the real application flow of
``examples/ingest`` (fetch -> parse -> enrich -> index, with its domain tables and guarded
transitions). A feeder inserts documents and starts one run each at ``RATE`` per second for
``DURATION`` seconds; the enrichment provider takes ``ENRICH_SECONDS`` per call (not rate limited
here), so enrichment demand is ``RATE x ENRICH_SECONDS`` = 12 busy slots. The same 8 handler
slots serve both modes:

* **shared**: the plain flow; two workers with 4 slots each poll its one queue;
* **step queues**: ``with_step_queues``; enrich 4 slots, fetch 2, parse 1, index 1 (one worker each).

Measured: ``started_at - queued_at`` of the fetch, parse and index tasks (a task not started when
the window closes counts with its wait so far) of runs started after ``WARMUP`` seconds; p50 and
p99 in ms (**lower is better**; ratio = saturated / idle, idle = enrichment returning at once).
"""

from __future__ import annotations

import os

import psycopg
from psycopg.types.json import Jsonb

from bench.benchmarks._starvation import WORKER_SETTINGS, compare, feed, percentile, queue_waits, running
from bench.core import Context, Result
from examples.ingest import domain
from examples.ingest.stepqueues.flow import build
from pgflow_cli.worker import Worker, WorkerOptions, with_step_queues

RATE = 8.0
ENRICH_SECONDS = 1.5
DURATION = 8.0
WARMUP = 2.0
STEP_SLOTS = {"fetch": 2, "parse": 1, "enrich": 4, "index": 1}
FAST = ("fetch", "parse", "index")


def _workers(mode: str, conninfo: str) -> list[Worker]:
    common = dict(WORKER_SETTINGS, application_name="pgflow-bench")
    if mode == "shared":
        flow = build("ingestShared")
        return [Worker(flow, conninfo, function_name="bench-ingest", options=WorkerOptions(**common)) for _ in range(2)]
    queued = with_step_queues(build("ingestSteps"))
    return [Worker(queued, conninfo, function_name=f"bench-ingest-{step}", step_slug=step,
                   options=WorkerOptions(**dict(common, max_concurrent=slots, batch_size=slots)))
            for step, slots in STEP_SLOTS.items()]


def sample(ctx: Context, mode: str, loaded: bool) -> tuple[float, float, int]:
    """One feed window; returns (p50 ms, p99 ms, fast tasks measured)."""
    domain.configure_provider(latency=ENRICH_SECONDS if loaded else 0.0)
    with ctx.database(f"ingest_{mode}_{'load' if loaded else 'idle'}") as conninfo:
        os.environ["INGEST_DSN"] = conninfo
        with psycopg.connect(conninfo, autocommit=True) as conn:
            domain.create_schema(conn)
            workers = _workers(mode, conninfo)

            def start(n: int) -> str:
                with conn.transaction():
                    domain.insert_documents(conn, [(n + 1, f"doc://{n + 1}")])
                    return str(conn.execute("SELECT run_id::text FROM pgflow.start_flow(%s, %s)",
                                            (workers[0].flow.slug, Jsonb({"doc_id": n + 1}))).fetchone()[0])

            with running(workers):
                conn.execute("ANALYZE")
                run_ids = feed(RATE, DURATION, start)
                waits = queue_waits(conn, FAST, [r for t, r in run_ids if t >= WARMUP])
                if conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE status = 'failed'").fetchone()[0]:
                    raise RuntimeError(f"{mode}: a task failed")
    return percentile(waits, 0.5), percentile(waits, 0.99), len(waits)


def run(ctx: Context) -> list[Result]:
    details = {"rate_docs_per_s": RATE, "enrich_seconds": ENRICH_SECONDS, "duration_s": DURATION,
               "warmup_s": WARMUP, "slots": 8, "step_slots": STEP_SLOTS, "lower_is_better": True}
    return compare(ctx, sample, title="ingest starvation", measured="ingest fast stages wait", busy="enrich",
                   details=details)

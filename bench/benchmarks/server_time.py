"""Server time per task: how much time the database spends executing the protocol calls of one
task, next to one bare PGMQ send + read + archive cycle, from ``pg_stat_statements``.

This benchmark starts its own private server with ``shared_preload_libraries =
pg_stat_statements`` (the other benchmarks' server does not load it) and
``pg_stat_statements.track = top``: only top-level statements are recorded, and a top-level
``SELECT pgflow.complete_task(...)`` includes everything its PL/pgSQL body runs, so nested
statements are neither lost nor counted twice (with ``track = all`` each nested statement would
be recorded as well, on top of the call that ran it). The figure is the sum of
``total_exec_time`` (wall time inside the executor; on a busy machine that includes waiting for
a CPU, equally on both sides) of every statement the sample's database ran between a
``pg_stat_statements_reset()`` and the end of the sample, divided by the tasks (or messages).
Planning time is not tracked (``track_planning`` off) for either side.

pgflow sample: a fresh database, a 3-step linear flow (no-op steps) compiled through the latest
protocol and one registered worker; N/3 warm-up runs go through the same connection first (so
its PL/pgSQL plans are cached, as in a long-lived worker), then ANALYZE and the reset. Recorded:
N runs started in one statement (``start_flows`` where the database has it, else
``start_flow`` per run inside one statement), then, until all 3N tasks are completed, the
Worker's calls on one connection: read 10 message ids, claim them, report them, as one
``complete_tasks`` call per claimed batch where the database has it ("batched") or one
``complete_task`` per task. No handler runs: the calls are made by the driver, so no long
poll ever waits (an empty ``read_with_poll`` would add its sleep to the time).

Bare sample: a fresh database with one queue, the same warm-up and reset; recorded: 3N
``pgmq.send`` calls (one message each), then ``pgmq.read`` of 10 and one ``pgmq.archive`` per
message until all are archived: per message, one cycle.

Result: microseconds of server time per task (**lower is better**); goal (issue 18) <= 2x the
bare cycle. Because ``total_exec_time`` is wall time, an overloaded machine inflates long
statements more than short ones (a statement shorter than a scheduler time slice is seldom
preempted; a 10-task ``complete_tasks`` of ~10 ms CPU is, and waits for every other runnable
process each time: measured at a load average of 9 on 2 cores, 46 ms of exec time per such call
against under 17 ms of backend CPU); so every sample (the bare one and both pgflow ones) also
reports the CPU time its one backend used over the same window (first field of
``/proc/<backend pid>/schedstat``, the server being local), per task, each pgflow figure against
the bare side's the same way. On a busy machine, read those pairs.
Samples interleave (bare, pgflow, pgflow one call per task, ...), ``ctx.repeat`` times.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from bench.core import Context, Result, statements_server
from pgflow_cli.worker import Flow
from pgflow_cli.worker.protocol import LATEST
from pgflow_cli.worker.runner import read_visibility

FLOW = "benchServerTime"
STEP_SLUGS = ("first", "second", "third")
STAGES = len(STEP_SLUGS)
BATCH = 10
TOTAL = ("SELECT COALESCE(sum(total_exec_time), 0), COALESCE(sum(calls), 0) FROM pg_stat_statements "
         "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
         "AND query NOT LIKE '%%pg_stat_statements%%'")
KINDS = {"start": "start_flow", "read": "pgmq.read", "claim": "claim_tasks", "complete": "complete_task"}


def _noop(value, ctx):
    return None


def _backend_cpu_ms(conn: psycopg.Connection) -> float:
    """CPU time the connection's server process has used so far, in ms (Linux schedstat)."""
    with open(f"/proc/{conn.info.backend_pid}/schedstat", encoding="ascii") as stat:
        return int(stat.read().split()[0]) / 1e6


def _server_ms(conn: psycopg.Connection) -> tuple[float, int]:
    total, calls = conn.execute(TOTAL).fetchone()
    return float(total), int(calls)


def _breakdown(conn: psycopg.Connection) -> dict[str, float]:
    """Milliseconds per kind of call (matched on the query text)."""
    out = {}
    for kind, needle in KINDS.items():
        row = conn.execute(TOTAL + " AND query LIKE %s", (f"%{needle}%",)).fetchone()
        out[kind] = round(float(row[0]), 2)
    return out


def linear_flow(slug: str) -> Flow:
    """The measured flow: the steps of :data:`STEP_SLUGS`, each depending on the one before, no-op handlers."""
    flow = Flow(slug)
    for i, step in enumerate(STEP_SLUGS):
        flow = flow.step(step, _noop, depends_on=STEP_SLUGS[i - 1:i])
    return flow


def pgflow_sample(ctx: Context, runs: int, *, batched: bool) -> tuple[float, dict[str, Any]]:
    protocol = LATEST()
    flow = linear_flow(FLOW)
    queue = protocol.queue_name(FLOW, None)
    worker_id = str(uuid.uuid4())
    with ctx.database("server_time") as conninfo, psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        protocol.check_version(conn)
        protocol.compile(conn, FLOW, flow.shape(), None)
        protocol.register(conn, worker_id=worker_id, function_name="bench-server-time", queue_name=queue,
                          flow_slug=FLOW, step_slug=None)
        batched = batched and protocol.has_batch_reports(conn)
        many_starts = conn.execute("SELECT to_regprocedure('pgflow.start_flows(text, jsonb)') IS NOT NULL").fetchone()[0]

        def start(n: int) -> None:
            if many_starts:
                conn.execute("SELECT count(*) FROM pgflow.start_flows(%s, "
                             "(SELECT jsonb_agg(jsonb_build_object('i', i)) FROM generate_series(1, %s) AS i))",
                             (FLOW, n))
            else:
                conn.execute("SELECT count(*) FROM generate_series(1, %s) AS i, "
                             "LATERAL pgflow.start_flow(%s, jsonb_build_object('i', i))", (n, FLOW))

        # the visibility the reference worker reads with (its steps' timeout + 2 s where the claim keeps it)
        read_vt = read_visibility(None, protocol.version, protocol.step_settings(conn, FLOW, None))

        def drain(n: int) -> None:
            done = 0
            while done < n * STAGES:
                ids = protocol.read(conn, queue_name=queue, vt=read_vt, qty=BATCH, max_poll_seconds=1, poll_interval_ms=10)
                if not ids:
                    raise RuntimeError(f"queue ran dry after {done} of {n * STAGES} tasks")
                claimed = protocol.claim(conn, flow_slug=FLOW, step_slug=None, queue_name=queue, message_ids=ids,
                                         worker_id=worker_id).claimed
                if batched and len(claimed) > 1:
                    protocol.complete_many(conn, [(task, None) for task in claimed])
                else:
                    for task in claimed:
                        protocol.complete(conn, task, None)
                done += len(claimed)

        warm = max(1, runs // 3)
        start(warm)
        drain(warm)
        conn.execute("ANALYZE")
        conn.execute("SELECT pg_stat_statements_reset()")
        cpu = _backend_cpu_ms(conn)
        start(runs)
        drain(runs)
        cpu = _backend_cpu_ms(conn) - cpu
        total_ms, calls = _server_ms(conn)
        details = {"breakdown_ms": _breakdown(conn), "calls": calls, "batched": batched, "start_flows": many_starts,
                   "backend_cpu_us_per_task": round(1000 * cpu / (runs * STAGES), 1)}
        left = conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE status <> 'completed' "
                            "OR attempts_count <> 1").fetchone()[0]
        if left:
            raise RuntimeError(f"{left} task(s) not completed on their first attempt")
    return 1000 * total_ms / (runs * STAGES), details


def bare_sample(ctx: Context, runs: int) -> tuple[float, float]:
    queue = "bench_bare"
    with ctx.database("server_time_bare") as conninfo, psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pgmq.create(%s)", (queue,))

        def cycle(messages: int) -> None:
            for i in range(messages):
                conn.execute("SELECT pgmq.send(%s, jsonb_build_object('i', %s::int))", (queue, i))
            done = 0
            while done < messages:
                ids = [r[0] for r in conn.execute("SELECT msg_id FROM pgmq.read(%s, 30, %s)", (queue, BATCH))]
                if not ids:
                    raise RuntimeError(f"bare queue ran dry after {done} of {messages}")
                for msg_id in ids:
                    conn.execute("SELECT pgmq.archive(%s, %s::bigint)", (queue, msg_id))
                done += len(ids)

        cycle(max(1, runs // 3) * STAGES)
        conn.execute("ANALYZE")
        conn.execute("SELECT pg_stat_statements_reset()")
        cpu = _backend_cpu_ms(conn)
        cycle(runs * STAGES)
        cpu = _backend_cpu_ms(conn) - cpu
        total_ms, _calls = _server_ms(conn)
    return 1000 * total_ms / (runs * STAGES), 1000 * cpu / (runs * STAGES)


def run(ctx: Context) -> list[Result]:
    runs = ctx.size(300)
    bare: list[float] = []
    batched: list[float] = []
    single: list[float] = []
    bare_cpu: list[float] = []
    batched_cpu: list[float] = []
    single_cpu: list[float] = []
    details: dict[str, Any] = {}
    single_details: dict[str, Any] = {}
    with statements_server(ctx, "server_time") as own:
        for i in range(ctx.repeat):
            value, cpu = bare_sample(own, runs)
            bare.append(value)
            bare_cpu.append(cpu)
            value, details = pgflow_sample(own, runs, batched=True)
            batched.append(value)
            batched_cpu.append(details["backend_cpu_us_per_task"])
            value, single_details = pgflow_sample(own, runs, batched=False)
            single.append(value)
            single_cpu.append(single_details["backend_cpu_us_per_task"])
            ctx.log(f"server_time {i + 1}/{ctx.repeat}: bare cycle {bare[-1]:.0f} us/msg, pgflow {batched[-1]:.0f} "
                    f"us/task (batched reports: {details['batched']}), one call per task {single[-1]:.0f} us/task; "
                    f"backend CPU: bare {bare_cpu[-1]:.0f}, pgflow {batched_cpu[-1]:.0f}, one call per task "
                    f"{single_cpu[-1]:.0f} us")
    baseline = "bare PGMQ send + read + archive, per message"
    common = {"lower_is_better": True, "read_batch": BATCH, "track": "top"}
    return [
        Result(baseline, "us/msg", bare, work=runs * STAGES, details=common),
        Result(f"{LATEST.__name__} start + read + claim + complete, per task (as the Worker reports)", "us/task",
               batched, work=runs * STAGES, baseline=baseline, details={**common, **details, "goal": "<= 2x"}),
        Result(f"{LATEST.__name__} start + read + claim + complete, per task, one complete_task per task", "us/task",
               single, work=runs * STAGES, baseline=baseline, details={**common, **single_details}),
        Result(f"{baseline} (backend CPU)", "us/msg", bare_cpu, work=runs * STAGES,
               details={**common, "clock": "schedstat"}),
        Result(f"{LATEST.__name__} per task, as the Worker reports (backend CPU)", "us/task", batched_cpu,
               work=runs * STAGES, baseline=f"{baseline} (backend CPU)", details={**common, "clock": "schedstat"}),
        Result(f"{LATEST.__name__} per task, one complete_task per task (backend CPU)", "us/task", single_cpu,
               work=runs * STAGES, baseline=f"{baseline} (backend CPU)", details={**common, "clock": "schedstat"}),
    ]

"""Claim throughput: messages claimed per second through the worker's claim entry point (the
latest protocol's ``read`` + ``claim``, exactly as the reference Worker calls them, no handlers),
next to a bare PGMQ ``read`` + ``archive`` loop over the same number of messages, at batches of
10 (the Worker's default batch size) and of 50.

Claim sample: a fresh database with a 1-step flow compiled and one registered worker (the
protocol's own ``check_version`` / ``compile`` / ``register``); N runs are started beforehand
(N queued tasks, N messages) and the database is ANALYZEd (not timed). Timed: read B message
ids, claim them, until N tasks are claimed. Checked after timing: N tasks started on their
first attempt.

Baseline sample: N messages sent to a plain queue beforehand, ANALYZE; timed: read B, archive
those B (one call), until N are archived. Each batch size B has its own baseline; goal (issue
18): read + claim >= 0.5x of read + archive at both.

Also measured at batch 10, each next to the batch-10 baseline:

* the claim without the ANALYZE: the state right after a burst of runs on fresh tables, before
  autovacuum has gathered statistics (the planner then expects almost empty tables);
* when the latest protocol is newer than 1: protocol 1 (``start_tasks``) on a database at the
  released baseline schema, to show what the newer claim costs; the latest claim's samples are
  also reported against it (goal for the classifying claim: at least 0.8x).

Samples are interleaved (baseline 10, claim 10, cold claim, protocol 1, baseline 50, claim 50,
baseline 10, ...), ``ctx.repeat`` times each. The batch-10 and batch-50 pairs are also reported by
the server backend's CPU clock (``/proc/<backend pid>/schedstat`` over the timed loop, messages per
CPU second): on a machine shared beyond its cores the wall clock favours the side with fewer,
shorter statements, the CPU clock does not.
"""

from __future__ import annotations

import uuid

import psycopg

from bench.benchmarks.claim_scaling import backend_cpu_ms
from bench.core import Context, Result, timed
from pgflow_cli import installer
from pgflow_cli.worker import Flow
from pgflow_cli.worker.protocol import LATEST, ProtocolV1
from pgflow_cli.worker.runner import read_visibility

FLOW = "benchClaim"
BATCH = 10
BIG_BATCH = 50


def _noop(value, ctx):
    return None


# The claim's own write and nothing else: the columns a claim changes on each task, by the same
# unique-key probe and ctid the claim uses, without its locks, classification, inputs or result rows.
# bench/benchmarks/claim_floor.py times it in place of the claim: the cost no claim can go below.
FLOOR_UPDATE = """
UPDATE pgflow.step_tasks AS t
   SET status = 'started', attempts_count = t.attempts_count + 1, started_at = clock_timestamp(),
       last_worker_id = %(worker_id)s
  FROM (SELECT x.ctid AS tid FROM unnest(%(ids)s::bigint[]) AS m CROSS JOIN LATERAL (
          SELECT y.ctid FROM pgflow.step_tasks AS y WHERE y.queue_name = %(queue)s AND y.message_id = m LIMIT 1) AS x) AS k
 WHERE t.ctid = k.tid AND t.status = 'queued'
"""

# What would let that write be HOT (no new index entry): no index on a column it changes (the six
# indexes with status, started_at or last_worker_id in their key or predicate, four of them upstream's,
# are dropped) and room on the page (fillfactor 50). Applied before the runs are started.
HOT_SCHEMA = """
DROP INDEX pgflow.idx_step_tasks_queued, pgflow.idx_step_tasks_started, pgflow.idx_step_tasks_completed,
           pgflow.idx_step_tasks_failed, pgflow.idx_step_tasks_manual_waiting, pgflow.idx_step_tasks_last_worker_status;
ALTER TABLE pgflow.step_tasks SET (fillfactor = 50)
"""


def claim_sample(ctx: Context, messages: int, *, protocol=None, schema: int | None = None, analyze: bool = True,
                 batch: int = BATCH, write: str = "claim") -> tuple[float, float]:
    """Messages per wall second and per backend CPU second of read + claim, ``batch`` at a time.

    ``write``: ``"claim"`` calls the protocol's claim; ``"floor"`` runs only :data:`FLOOR_UPDATE`
    in its place; ``"hot_floor"`` runs it on a schema changed by :data:`HOT_SCHEMA`.
    """
    protocol = protocol or LATEST()
    flow = Flow(FLOW).step("only", _noop)
    worker_id = str(uuid.uuid4())
    queue = protocol.queue_name(FLOW, None)
    with ctx.database(f"claim_v{protocol.version}", schema=schema) as conninfo, \
            psycopg.connect(conninfo, autocommit=True) as conn:
        protocol.check_version(conn)
        protocol.compile(conn, FLOW, flow.shape(), None)
        protocol.register(conn, worker_id=worker_id, function_name="bench-claim", queue_name=queue,
                          flow_slug=FLOW, step_slug=None)
        if write == "hot_floor":
            conn.execute(HOT_SCHEMA)
        conn.execute("SELECT count(*) FROM generate_series(1, %s) AS i, "
                     "LATERAL pgflow.start_flow(%s, jsonb_build_object('i', i))", (messages, FLOW))
        if analyze:
            conn.execute("ANALYZE")  # steady-state statistics, as a live database has them

        # the visibility the reference worker reads with (its steps' timeout + 2 s where the claim keeps it)
        read_vt = read_visibility(None, protocol.version, protocol.step_settings(conn, FLOW, None))

        def loop() -> int:
            claimed = 0
            while claimed < messages:
                ids = protocol.read(conn, queue_name=queue, vt=read_vt, qty=batch, max_poll_seconds=1, poll_interval_ms=10)
                if not ids:
                    raise RuntimeError(f"queue ran dry after {claimed} claims")
                if write != "claim":
                    claimed += conn.execute(FLOOR_UPDATE, {"worker_id": worker_id, "ids": ids, "queue": queue}).rowcount
                    continue
                outcome = protocol.claim(conn, flow_slug=FLOW, step_slug=None, queue_name=queue,
                                         message_ids=ids, worker_id=worker_id)
                if outcome.fatal_reason:
                    raise RuntimeError(f"claim refused the batch: {outcome.fatal_reason}")
                claimed += len(outcome.claimed)
            return claimed

        cpu = backend_cpu_ms(conn)
        seconds, claimed = timed(loop)
        cpu = backend_cpu_ms(conn) - cpu
        started = conn.execute(
            "SELECT count(*) FROM pgflow.step_tasks WHERE status = 'started' AND attempts_count = 1").fetchone()[0]
        if started != messages or claimed != messages:
            raise RuntimeError(f"claimed {claimed}, {started} tasks started, expected {messages}")
    return messages / seconds, messages / (cpu / 1000)


def bare_sample(ctx: Context, messages: int, batch: int = BATCH) -> tuple[float, float]:
    queue = "bench_bare"
    with ctx.database("claim_bare") as conninfo, psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT pgmq.create(%s)", (queue,))
        conn.execute("SELECT pgmq.send_batch(%s, array_agg(jsonb_build_object('i', i))) FROM generate_series(1, %s) AS i",
                     (queue, messages))
        conn.execute("ANALYZE")

        def loop() -> None:
            done = 0
            while done < messages:
                ids = [r[0] for r in conn.execute("SELECT msg_id FROM pgmq.read(%s, 30, %s)", (queue, batch)).fetchall()]
                if not ids:
                    raise RuntimeError(f"queue ran dry after {done} messages")
                conn.execute("SELECT count(*) FROM pgmq.archive(%s, %s::bigint[])", (queue, ids))
                done += len(ids)

        cpu = backend_cpu_ms(conn)
        seconds, _ = timed(loop)
        cpu = backend_cpu_ms(conn) - cpu
        left = conn.execute("SELECT count(*) FROM pgmq.q_bench_bare").fetchone()[0]
        if left:
            raise RuntimeError(f"{left} messages left in the bare queue")
    return messages / seconds, messages / (cpu / 1000)


def run(ctx: Context) -> list[Result]:
    messages = ctx.size(2000)
    with_v1 = LATEST.version > ProtocolV1.version
    bare: list[float] = []
    claims: list[float] = []
    cold: list[float] = []
    v1: list[float] = []
    bare_big: list[float] = []
    claims_big: list[float] = []
    cpu: dict[str, list[float]] = {"bare": [], "claim": [], "bare_big": [], "claim_big": []}

    def both(key: str, sample: tuple[float, float], into: list[float]) -> None:
        into.append(sample[0])
        cpu[key].append(sample[1])

    for i in range(ctx.repeat):
        both("bare", bare_sample(ctx, messages), bare)
        both("claim", claim_sample(ctx, messages), claims)
        cold.append(claim_sample(ctx, messages, analyze=False)[0])
        line = (f"claim {i + 1}/{ctx.repeat}: bare read+archive {bare[-1]:.0f} msg/s, protocol {LATEST.version} "
                f"claim {claims[-1]:.0f} msg/s (before ANALYZE {cold[-1]:.0f})")
        if with_v1:
            v1.append(claim_sample(ctx, messages, protocol=ProtocolV1(), schema=installer.BASELINE_VERSION)[0])
            line += f", protocol 1 on the baseline schema {v1[-1]:.0f}"
        both("bare_big", bare_sample(ctx, messages, BIG_BATCH), bare_big)
        both("claim_big", claim_sample(ctx, messages, batch=BIG_BATCH), claims_big)
        line += f"; batch {BIG_BATCH}: bare {bare_big[-1]:.0f}, claim {claims_big[-1]:.0f}"
        ctx.log(line)
    baseline = "bare PGMQ read + archive"
    details = {"batch": BATCH, "connections": 1, "protocol": LATEST.version}
    results = [
        Result(baseline, "msg/s", bare, work=messages, details={"batch": BATCH, "connections": 1}),
        Result(f"{LATEST.__name__} read + claim (no handlers)", "msg/s", claims, work=messages, baseline=baseline,
               details={**details, "goal": ">= 0.5x"}),
        Result(f"{LATEST.__name__} read + claim, before any ANALYZE", "msg/s", cold, work=messages, baseline=baseline,
               details={**details, "analyze": False}),
    ]
    big_baseline = f"bare PGMQ read + archive, batch {BIG_BATCH}"
    results += [
        Result(big_baseline, "msg/s", bare_big, work=messages, details={"batch": BIG_BATCH, "connections": 1}),
        Result(f"{LATEST.__name__} read + claim, batch {BIG_BATCH} (no handlers)", "msg/s", claims_big, work=messages,
               baseline=big_baseline, details={**details, "batch": BIG_BATCH, "goal": ">= 0.5x"}),
    ]
    # the same loops by the backend's CPU clock (messages per CPU second of its one server process)
    for key, name, base_key, batch in (("claim", f"{LATEST.__name__} read + claim", "bare", BATCH),
                                       ("claim_big", f"{LATEST.__name__} read + claim, batch {BIG_BATCH}", "bare_big",
                                        BIG_BATCH)):
        cpu_base = f"bare PGMQ read + archive, batch {batch} (backend CPU)"
        results += [
            Result(cpu_base, "msg/CPU s", cpu[base_key], work=messages, details={"batch": batch, "clock": "schedstat"}),
            Result(f"{name} (backend CPU)", "msg/CPU s", cpu[key], work=messages, baseline=cpu_base,
                   details={**details, "batch": batch, "clock": "schedstat", "goal": ">= 0.5x"}),
        ]
    if with_v1:
        v1_name = f"ProtocolV1 read + claim on schema {installer.BASELINE_VERSION:04d}"
        results.append(Result(v1_name, "msg/s", v1, work=messages, baseline=baseline,
                              details={**details, "protocol": 1, "schema": installer.BASELINE_VERSION}))
        # The classifying claim's own goal (issue "Claim protocol"): at least 0.8x the baseline claim.
        results.append(Result(f"{LATEST.__name__} read + claim, against protocol 1", "msg/s", claims,
                              work=messages, baseline=v1_name, details={**details, "goal": ">= 0.8x"}))
    return results

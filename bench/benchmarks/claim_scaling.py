"""Claim latency as the database grows: does claiming 10 messages cost more when the tables hold
100 times more history, or when the claim runs against a big map before any statistics exist?
Measured on both protocols: protocol 1 (``start_tasks``) on a database at the released baseline
schema, and the latest protocol (``claim_tasks``) on a database with every migration. Protocol 1
exists only there: from migration 0003 on ``start_tasks`` refuses every call (``PF002``, before it
reads any table) and ``protocol_version()`` is 2, so a protocol-1 worker cannot claim on an upgraded
database and there is no protocol-1 claim at the latest schema to measure. Its rows measure the
released baseline text that level 2 installs verbatim (labelled so).

What is timed, in every sample: the protocol's ``claim`` call alone (as the reference Worker
makes it) for 10 message ids that the same connection has just read (the ``read`` is not timed);
a sample is the median of ``CLAIMS`` (45; map: ``MAP_CLAIMS``, 9) such claims, in milliseconds
(**lower is better**).

* **history**: a 1-step flow with 1,000 runs completed through the protocol (read, claim,
  complete), or with those 1,000 copied 99 more times (runs, step states, tasks and archived
  messages duplicated with new ids, 100,000 finished runs in all); then ``ANALYZE``, then
  ``10 * CLAIMS`` new runs started (not timed). The 1,000-run database is the baseline of the
  100,000-run one. Both databases are built once per protocol and sampled alternately.
* **map before ANALYZE**: a fresh database per sample with a flow whose only step is a root map;
  autovacuum is switched off for its pgflow and PGMQ tables, one run of 100 (baseline) or 10,000
  elements is started, and the claims follow at once, with no ``ANALYZE`` (the planner has no
  statistics of the fresh tables). Checked after timing: no table was analyzed meanwhile.

Each quantity is reported twice: by the wall clock, and by the backend's own CPU time over the same
claims (``/proc/<backend pid>/schedstat``; on a machine shared beyond its cores the wall clock of a
2 ms statement is mostly time spent waiting for a core, the CPU clock is not).

Goal (issue 18): every ratio <= 1.2, on both protocols. Samples are interleaved (baseline,
measured, baseline, ...), ``ctx.repeat`` times each.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from bench.core import Context, Result
from pgflow_cli import installer
from pgflow_cli.worker import Flow
from pgflow_cli.worker.protocol import LATEST, ProtocolV1

BATCH = 10
CLAIMS = 45
"""Claims per history sample (45 rather than 15: a 2 ms claim's median over 15 wandered by 10-20%
between samples on a shared machine, as much as the effect measured)."""
MAP_CLAIMS = 9
"""Claims per map sample (the 100-task map has 10 batches; the first 9 follow right after its start)."""
HISTORY_FLOW = "benchScale"
MAP_FLOW = "benchMap"
ID_STRIDE = 10_000_000
"""Message-id offset between copies of the history (keeps (queue, message id) unique)."""


def _noop(value, ctx):
    return None


def backend_cpu_ms(conn: psycopg.Connection) -> float:
    """CPU time the connection's server process has used so far, in ms (Linux schedstat)."""
    with open(f"/proc/{conn.info.backend_pid}/schedstat", encoding="ascii") as stat:
        return int(stat.read().split()[0]) / 1e6


class Session:
    """One database, one connection, one registered worker of ``flow`` speaking ``protocol``."""

    def __init__(self, conn: psycopg.Connection, protocol: Any, flow: Flow) -> None:
        self.conn, self.protocol, self.flow = conn, protocol, flow
        self.queue = protocol.queue_name(flow.slug, None)
        self.worker_id = str(uuid.uuid4())
        protocol.check_version(conn)
        protocol.compile(conn, flow.slug, flow.shape(), None)
        protocol.register(conn, worker_id=self.worker_id, function_name="bench-scale", queue_name=self.queue,
                          flow_slug=flow.slug, step_slug=None)

    def read(self, qty: int) -> list[int]:
        return self.protocol.read(self.conn, queue_name=self.queue, vt=60, qty=qty, max_poll_seconds=1,
                                  poll_interval_ms=10)

    def claim(self, ids: list[int]) -> list:
        outcome = self.protocol.claim(self.conn, flow_slug=self.flow.slug, step_slug=None, queue_name=self.queue,
                                      message_ids=ids, worker_id=self.worker_id)
        if getattr(outcome, "fatal_reason", None):
            raise RuntimeError(f"claim refused the batch: {outcome.fatal_reason}")
        return outcome.claimed

    def timed_claims(self, count: int) -> tuple[float, float]:
        """Median milliseconds of ``count`` claims of ``BATCH`` freshly read messages: wall clock, and
        the backend's CPU time (``/proc/<backend pid>/schedstat``, the server is local)."""
        times, cpu = [], []
        for _ in range(count):
            ids = self.read(BATCH)
            if len(ids) != BATCH:
                raise RuntimeError(f"read {len(ids)} messages, expected {BATCH}")
            start, cpu_start = time.perf_counter(), backend_cpu_ms(self.conn)
            claimed = self.claim(ids)
            times.append((time.perf_counter() - start) * 1000)
            cpu.append(backend_cpu_ms(self.conn) - cpu_start)
            if len(claimed) != BATCH:
                raise RuntimeError(f"claimed {len(claimed)} of {BATCH} tasks")
        return statistics.median(times), statistics.median(cpu)

    def start_runs(self, count: int) -> None:
        self.conn.execute("SELECT count(*) FROM generate_series(1, %s) AS i, "
                          "LATERAL pgflow.start_flow(%s, jsonb_build_object('i', i))", (count, self.flow.slug))


def _complete_history(s: Session, runs: int) -> None:
    """Start ``runs`` runs and take each through read, claim and complete (not timed)."""
    s.start_runs(runs)
    done = 0
    while done < runs:
        ids = s.read(50)
        if not ids:
            raise RuntimeError(f"history queue ran dry after {done} of {runs} runs")
        for task in s.claim(ids):
            s.protocol.complete(s.conn, task, None)
            done += 1


def _copy_history(s: Session, copies: int) -> None:
    """Duplicate every finished run ``copies`` times: runs, step states, tasks, archived messages."""
    archive = s.conn.execute("SELECT pgmq.format_table_name(%s, 'a')", (s.queue,)).fetchone()[0]
    # LATERAL, not (jsonb_populate_record(...)).*, which would call the function once per column
    statements = [
        "CREATE TEMP TABLE copies AS SELECT k, r.run_id AS old_id, gen_random_uuid() AS new_id "
        "FROM pgflow.runs AS r, generate_series(1, %(copies)s) AS k WHERE r.status = 'completed'",
        "ANALYZE copies",
        "INSERT INTO pgflow.runs SELECT p.* FROM pgflow.runs AS r JOIN copies AS c ON c.old_id = r.run_id, "
        "LATERAL jsonb_populate_record(NULL::pgflow.runs, to_jsonb(r) || jsonb_build_object('run_id', c.new_id)) AS p",
        "INSERT INTO pgflow.step_states SELECT p.* FROM pgflow.step_states AS x JOIN copies AS c ON c.old_id = x.run_id, "
        "LATERAL jsonb_populate_record(NULL::pgflow.step_states, to_jsonb(x) || jsonb_build_object('run_id', c.new_id)) AS p",
        sql.SQL("INSERT INTO pgmq.{a} SELECT p.* FROM pgmq.{a} AS m "
                "JOIN pgflow.step_tasks AS t ON t.message_id = m.msg_id JOIN copies AS c ON c.old_id = t.run_id, "
                "LATERAL jsonb_populate_record(NULL::pgmq.{a}, "
                "to_jsonb(m) || jsonb_build_object('msg_id', m.msg_id + c.k * %(stride)s)) AS p")
        .format(a=sql.Identifier(archive)),
        "INSERT INTO pgflow.step_tasks SELECT p.* FROM pgflow.step_tasks AS t JOIN copies AS c ON c.old_id = t.run_id, "
        "LATERAL jsonb_populate_record(NULL::pgflow.step_tasks, to_jsonb(t) || jsonb_build_object("
        "'run_id', c.new_id, 'message_id', t.message_id + c.k * %(stride)s)) AS p",
        "DROP TABLE copies",
    ]
    # The copies are consistent by construction (same flows, steps, workers and queue names as the
    # originals): the foreign-key and other triggers are skipped while they are written
    # (session_replication_role = replica, superuser only), which makes the copy seconds, not minutes.
    s.conn.execute("ANALYZE")
    s.conn.execute("SET session_replication_role = replica")
    try:
        for statement in statements:
            s.conn.execute(statement, {"copies": copies, "stride": ID_STRIDE})
    finally:
        s.conn.execute("RESET session_replication_role")


def history_database(ctx: Context, stack: Any, protocol: Any, schema: int | None, runs: int) -> Session:
    conninfo = stack.enter_context(ctx.database(f"scale_hist_v{protocol.version}", schema=schema))
    conn = stack.enter_context(psycopg.connect(conninfo, autocommit=True))
    s = Session(conn, protocol, Flow(HISTORY_FLOW).step("only", _noop))
    base = min(runs, 1000)
    _complete_history(s, base)
    if runs > base:
        _copy_history(s, runs // base - 1)
    finished = conn.execute("SELECT count(*) FROM pgflow.runs WHERE status = 'completed'").fetchone()[0]
    if finished != runs:
        raise RuntimeError(f"{finished} finished runs, expected {runs}")
    conn.execute("ANALYZE")
    return s


def history_sample(s: Session) -> tuple[float, float]:
    s.start_runs(BATCH * CLAIMS)
    return s.timed_claims(CLAIMS)


def map_sample(ctx: Context, protocol: Any, schema: int | None, elements: int) -> tuple[float, float]:
    with ctx.database(f"scale_map_v{protocol.version}", schema=schema) as conninfo, \
            psycopg.connect(conninfo, autocommit=True) as conn:
        s = Session(conn, protocol, Flow(MAP_FLOW).map("each", _noop))
        # no autovacuum either: on a busy machine it could analyze the tables before the claims
        tables = conn.execute("SELECT schemaname, relname FROM pg_stat_user_tables "
                              "WHERE schemaname IN ('pgflow', 'pgmq')").fetchall()
        for schema_name, table in tables:
            conn.execute(sql.SQL("ALTER TABLE {}.{} SET (autovacuum_enabled = false)")
                         .format(sql.Identifier(schema_name), sql.Identifier(table)))
        conn.execute("SELECT pgflow.start_flow(%s, %s)", (MAP_FLOW, Jsonb(list(range(elements)))))
        ms = s.timed_claims(MAP_CLAIMS)
        analyzed = conn.execute(
            "SELECT count(*) FROM pg_stat_user_tables WHERE schemaname IN ('pgflow', 'pgmq') "
            "AND (last_autoanalyze IS NOT NULL OR last_analyze IS NOT NULL)").fetchone()[0]
        if analyzed:
            raise RuntimeError(f"{analyzed} table(s) were analyzed during the sample; it is not 'before ANALYZE'")
    return ms


def _add(samples: dict[str, list[float]], key: str, sample: tuple[float, float]) -> None:
    """Record one (wall ms, CPU ms) sample under ``key`` and ``key_cpu``."""
    samples[key].append(sample[0])
    samples[key + "_cpu"].append(sample[1])


def run(ctx: Context) -> list[Result]:
    small_hist, big_hist = ctx.size(1000, 1000), ctx.size(100_000, 2000)
    big_hist -= big_hist % small_hist
    small_map, big_map = 100, ctx.size(10_000, 1000)
    protocols = [(ProtocolV1(), installer.BASELINE_VERSION), (LATEST(), None)]
    results: list[Result] = []
    for protocol, schema in protocols:
        label = f"protocol {protocol.version}" + (f" (schema {schema:04d}, released start_tasks)" if schema else "")
        samples: dict[str, list[float]] = {k + cpu: [] for k in ("small_hist", "big_hist", "small_map", "big_map")
                                           for cpu in ("", "_cpu")}

        with contextlib.ExitStack() as stack:
            built = time.monotonic()
            small = history_database(ctx, stack, protocol, schema, small_hist)
            big = history_database(ctx, stack, protocol, schema, big_hist)
            ctx.log(f"claim_scaling {label}: built {small_hist} and {big_hist} finished runs in "
                    f"{time.monotonic() - built:.0f}s")
            for i in range(ctx.repeat):
                _add(samples, "small_hist", history_sample(small))
                _add(samples, "big_hist", history_sample(big))
                _add(samples, "small_map", map_sample(ctx, protocol, schema, small_map))
                _add(samples, "big_map", map_sample(ctx, protocol, schema, big_map))
                ctx.log(f"claim_scaling {label} {i + 1}/{ctx.repeat}: history {samples['small_hist'][-1]:.2f} / "
                        f"{samples['big_hist'][-1]:.2f} ms, map {samples['small_map'][-1]:.2f} / "
                        f"{samples['big_map'][-1]:.2f} ms (backend CPU {samples['small_hist_cpu'][-1]:.2f} / "
                        f"{samples['big_hist_cpu'][-1]:.2f}, {samples['small_map_cpu'][-1]:.2f} / "
                        f"{samples['big_map_cpu'][-1]:.2f})")
        details = {"batch": BATCH, "claims_per_sample": {"history": CLAIMS, "map": MAP_CLAIMS},
                   "protocol": protocol.version, "schema": schema, "lower_is_better": True, "goal": "<= 1.2x"}
        hist_base = f"{label}: claim of {BATCH}, {small_hist:,} finished runs"
        map_base = f"{label}: claim of {BATCH}, {small_map}-task map, before ANALYZE"
        for suffix, clock in (("", ""), ("_cpu", " (backend CPU)")):
            cpu_details = {**details, "clock": "schedstat"} if suffix else details
            results += [
                Result(hist_base + clock, "ms", samples["small_hist" + suffix], work=BATCH, details=cpu_details),
                Result(f"{label}: claim of {BATCH}, {big_hist:,} finished runs{clock}", "ms", samples["big_hist" + suffix],
                       work=BATCH, baseline=hist_base + clock, details=cpu_details),
                Result(map_base + clock, "ms", samples["small_map" + suffix], work=BATCH, details=cpu_details),
                Result(f"{label}: claim of {BATCH}, {big_map:,}-task map, before ANALYZE{clock}", "ms",
                       samples["big_map" + suffix], work=BATCH, baseline=map_base + clock, details=cpu_details),
            ]
    return results

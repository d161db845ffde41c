"""Claim and complete next to a large finished history: does one task's read + claim + complete cost
more when the tables hold ``HISTORY_TASKS`` (10,000,000) finished tasks than on the same schema with
none? Issue 28's goal: cost <= 1.2x.

Two databases of the same server, built once per bench run and dropped at its end:

* **empty**: every migration, the flows below compiled and one worker registered per queue, one
  finished run of each template kind (below), a warm-up drain, ``ANALYZE``;
* **history**: the same, then about ``HISTORY_TASKS`` finished tasks written in bulk
  (:func:`write_history`, set-based ``INSERT ... SELECT``, not through the runtime), then
  ``VACUUM ANALYZE`` of the pgflow and PGMQ tables (what autovacuum does to insert-only tables:
  statistics and the visibility map), as a live database has them.

The history is copies of real runs made through the protocol in the same database (the templates):
a 3-step linear flow (the flow measured, 5 runs in 10), a flow whose middle step maps over an
8-element array (1 in 10), a flow with private step queues (2 in 10), and a flow whose task fails
once then completes (1 in 10) or fails twice and fails its run (1 in 10): about 3.2 tasks per run,
five queues. Each copy gets a random run id, message ids unique per queue above the template's, its
timestamps moved into the last 30 days, and a finished worker row (one of many per queue) as its
tasks' last worker; every archived message of the templates is copied into its queue's archive with
the copy's message id and run id. Foreign-key and other triggers are skipped while the copies are
written (``session_replication_role = replica``, the bench server's superuser): the copies are
consistent by construction (checked afterwards by counting orphans), and checking them would only
slow the build. Each queue's message sequence is moved past the copies, as a live queue's would be.

What is timed, in every sample (:func:`sample`): ``WARM_RUNS + LIVE_RUNS`` runs of the 3-step flow
are started (not timed; the empty database is ANALYZEd then, see :func:`sample` for why), the tasks of
``WARM_RUNS`` runs are drained untimed, then one connection makes the reference Worker's calls for the
next ``3 * LIVE_RUNS`` tasks: read 10 message ids (``read_with_poll``, with the visibility the Worker
reads with), ``claim_tasks`` them, report them in one ``complete_tasks`` call. Per task: the wall clock
of that loop, and the backend's CPU (``/proc/<backend pid>/schedstat``, the server is local), also
split into claim and complete. Samples interleave (empty, history, empty, ...), ``ctx.repeat`` rounds,
on one long-lived connection per database (a worker's); the result is microseconds per task (**lower
is better**). "Empty" holds only the templates and the finished runs of its own samples (under 2,000
runs after 5 rounds).

Also measured once: right after the bulk load, before any ``ANALYZE`` of it (autovacuum is off for
these tables until then, so the planner still has the statistics of the small database), a fresh
connection on each side takes one sample. Over the rounds: blocks read into shared buffers and found
there per task, the relations read most, and the share of HOT updates of runs, step states and tasks
(``pg_stat_database``, ``pg_statio_*``, ``pg_stat_user_tables``), on both sides. And the plans, after
the rounds: with ``auto_explain`` (``log_analyze``, nested statements) on the history database's warm
connection, one claim batch and its report; every scan node on a history table (runs, step states,
tasks, workers, PGMQ archives, and their indexes) that read more than ``SCAN_LIMIT`` rows (returned
and filtered out) is reported, and how many were sequential scans with the most rows one read.

``--scale`` scales ``HISTORY_TASKS`` (``--scale 0.1``: 1,000,000 tasks); the live work stays the same.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from bench.benchmarks.claim_scaling import backend_cpu_ms
from bench.core import Context, Result
from pgflow_cli.worker import Flow
from pgflow_cli.worker.failures import TaskFailure
from pgflow_cli.worker.flow import with_step_queues
from pgflow_cli.worker.protocol import LATEST, ClaimedTask
from pgflow_cli.worker.runner import read_visibility

HISTORY_TASKS = 10_000_000
LIVE_RUNS = 300
"""Runs of the measured 3-step flow per sample (900 tasks, 90 claims and 90 reports)."""
WARM_RUNS = 20
"""Untimed runs before every sample (60 tasks: each statement of the loop runs 6 times or more)."""
BATCH = 10
RUNS_PER_WRITE = 100_000
"""Copies written per transaction (320,000 tasks)."""
ID_STRIDE = 16
"""Message ids reserved per copied run and queue (more than any template's tasks in one queue)."""
SPAN_DAYS = 30
SCAN_LIMIT = 1_000
"""Rows a scan node of a history table may read in one claim or report before the plan check names it."""
WORKERS_PER_QUEUE_PER_RUNS = 20_000
"""One finished worker row per queue for this many copied runs (workers come and go with deploys)."""


def _noop(value: Any, ctx: Any) -> None:
    return None


LIVE = Flow("histLive").step("first", _noop).step("second", _noop, depends_on=["first"]) \
    .step("third", _noop, depends_on=["second"])
MAPPED = Flow("histMap").step("list", _noop).map("each", _noop, array="list").step("total", _noop, depends_on=["each"])
STEPPED = with_step_queues(Flow("histSteps").step("fetch", _noop).step("store", _noop, depends_on=["fetch"]))
FLAKY = Flow("histFlaky", max_attempts=2, base_delay=0).step("call", _noop).step("record", _noop, depends_on=["call"])

KINDS = ("live", "map", "steps", "retried", "failed")
PATTERN = (0, 0, 0, 0, 0, 1, 2, 2, 3, 4)
"""The template kind of copy ``i`` is ``KINDS[PATTERN[i % 10]]``."""
HISTORY_TABLES = ("runs", "step_states", "step_tasks", "workers")


@dataclass
class Route:
    """One queue a registered worker of the benchmark serves."""

    flow: Any
    step_slug: str | None
    queue: str
    worker_id: str = field(default_factory=lambda: str(uuid.uuid4()))


class Database:
    """One benchmark database: the flows compiled, one worker registered per queue, one connection."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.protocol = LATEST()
        self.conn = psycopg.connect(conninfo, autocommit=True)
        p, c = self.protocol, self.conn
        p.check_version(c)
        self.routes = [Route(LIVE, None, p.queue_for(LIVE, None)), Route(MAPPED, None, p.queue_for(MAPPED, None)),
                       Route(FLAKY, None, p.queue_for(FLAKY, None))]
        self.routes += [Route(STEPPED, s, STEPPED.queue_for(s)) for s in STEPPED.step_slugs]
        for route in self.routes:
            p.compile_flow(c, route.flow, route.step_slug)
            p.register(c, worker_id=route.worker_id, function_name="bench-history", queue_name=route.queue,
                       flow_slug=route.flow.slug, step_slug=route.step_slug)
        self.live = self.routes[0]
        self.read_vt = read_visibility(None, p.version, p.step_settings(c, LIVE.slug, None))

    def reconnect(self) -> None:
        """A fresh connection (a newly started worker's: no cached plans)."""
        self.conn.close()
        self.conn = psycopg.connect(self.conninfo, autocommit=True)

    def close(self) -> None:
        self.conn.close()

    def claim(self, route: Route, ids: list[int]) -> list[ClaimedTask]:
        outcome = self.protocol.claim(self.conn, flow_slug=route.flow.slug, step_slug=route.step_slug,
                                      queue_name=route.queue, message_ids=ids, worker_id=route.worker_id)
        if outcome.fatal_reason:
            raise RuntimeError(f"claim refused the batch: {outcome.fatal_reason}")
        return outcome.claimed

    def start_live(self, runs: int) -> None:
        self.conn.execute("SELECT count(*) FROM pgflow.start_flows(%s, (SELECT jsonb_agg(jsonb_build_object('i', i)) "
                          "FROM generate_series(1, %s) AS i))", (LIVE.slug, runs))

    def drain_live(self, tasks: int) -> dict[str, float]:
        """Complete ``tasks`` tasks of the live flow's queue as the Worker does (read, claim, one report
        per batch); returns the seconds and the backend CPU ms of the loop, split by call."""
        p, c, route = self.protocol, self.conn, self.live
        spent = {"read": 0.0, "claim": 0.0, "complete": 0.0}
        done = 0
        began = time.perf_counter()
        cpu = backend_cpu_ms(c)
        while done < tasks:
            ids = p.read(c, queue_name=route.queue, vt=self.read_vt, qty=min(BATCH, tasks - done), max_poll_seconds=1,
                         poll_interval_ms=10)
            if not ids:
                raise RuntimeError(f"the live queue ran dry after {done} of {tasks} tasks")
            after_read = backend_cpu_ms(c)
            claimed = self.claim(route, ids)
            after_claim = backend_cpu_ms(c)
            p.complete_many(c, [(task, None) for task in claimed])
            after_complete = backend_cpu_ms(c)
            spent["read"] += after_read - cpu
            spent["claim"] += after_claim - after_read
            spent["complete"] += after_complete - after_claim
            cpu = after_complete
            done += len(claimed)
        return {"seconds": time.perf_counter() - began, **spent}

    def check_live_done(self) -> None:
        """Raise unless every run of the live flow has ended (read through the status index: a run of it
        cannot fail here, and a scan of its history would push the sample's pages out of the cache)."""
        left = self.conn.execute("SELECT count(*) FROM pgflow.runs WHERE status = 'started' AND flow_slug = %s",
                                 (LIVE.slug,)).fetchone()[0]
        if left:
            raise RuntimeError(f"{left} live run(s) not completed")

    def work_queue(self, route: Route, outcome: Any) -> int:
        """Claim every visible message of ``route``'s queue and report each task: ``outcome(task)`` is an
        output to complete it with, or a :class:`TaskFailure`. Returns the tasks reported."""
        done = 0
        while ids := [r[0] for r in self.conn.execute("SELECT msg_id FROM pgmq.read(%s, %s, %s)",
                                                       (route.queue, self.read_vt, BATCH))]:
            for task in self.claim(route, ids):
                result = outcome(task)
                if isinstance(result, TaskFailure):
                    self.protocol.fail(self.conn, task, result)
                else:
                    self.protocol.complete(self.conn, task, result)
                done += 1
        return done


def _failure() -> TaskFailure:
    return TaskFailure.plain("upstream answered 503", "UpstreamError")


def make_templates(db: Database) -> dict[int, str]:
    """One finished run of each kind, made through the protocol; returns ``{kind number: run id}``."""
    c = db.conn
    live, mapped, flaky = db.routes[0], db.routes[1], db.routes[2]
    stepped = db.routes[3:]
    runs: dict[int, str] = {}

    def start(flow: Any, value: Any) -> str:
        return str(c.execute("SELECT run_id FROM pgflow.start_flow(%s, %s)", (flow.slug, Jsonb(value))).fetchone()[0])

    def until_ended(run_id: str, routes: list[Route], outcome: Any) -> None:
        for _ in range(20):
            if c.execute("SELECT status FROM pgflow.runs WHERE run_id = %s", (run_id,)).fetchone()[0] != "started":
                return
            for route in routes:
                db.work_queue(route, outcome)
        raise RuntimeError(f"template run {run_id} did not end")

    runs[0] = start(LIVE, {"order": 1})
    until_ended(runs[0], [live], lambda task: {"ok": task.step_slug})
    runs[1] = start(MAPPED, {"batch": 7})
    until_ended(runs[1], [mapped], lambda task: list(range(8)) if task.step_slug == "list" else task.task_index)
    runs[2] = start(STEPPED, {"url": "https://example.com/a"})
    until_ended(runs[2], stepped, lambda task: {"bytes": 512})
    attempts: dict[str, int] = {}

    def flaky_once(task: ClaimedTask) -> Any:
        attempts[task.run_id] = attempts.get(task.run_id, 0) + 1
        return _failure() if task.step_slug == "call" and attempts[task.run_id] == 1 else {"ok": True}

    runs[3] = start(FLAKY, {"call": 1})
    until_ended(runs[3], [flaky], flaky_once)
    runs[4] = start(FLAKY, {"call": 2})
    until_ended(runs[4], [flaky], lambda task: _failure())
    statuses = dict(c.execute("SELECT run_id::text, status FROM pgflow.runs WHERE run_id = ANY(%s::uuid[])",
                              (list(runs.values()),)).fetchall())
    expected = {runs[0]: "completed", runs[1]: "completed", runs[2]: "completed", runs[3]: "completed",
                runs[4]: "failed"}
    if statuses != expected:
        raise RuntimeError(f"template runs ended as {statuses}, expected {expected}")
    return runs


def _columns(conn: psycopg.Connection, table: str) -> list[tuple[str, str]]:
    return conn.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass "
                        "AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (table,)).fetchall()


def _copy_statement(conn: psycopg.Connection, table: sql.Composable, regclass: str, template: str,
                    extra_join: str = "") -> sql.Composed:
    """``INSERT INTO table`` of one copy of every template row per run of ``hist_batch``: new run id,
    message id and worker, timestamps moved by the copy's shift, the run id inside a message replaced."""
    values = []
    for name, kind in _columns(conn, regclass):
        col = sql.SQL("tpl.{}").format(sql.Identifier(name))
        if name == "run_id":
            value: sql.Composable = sql.SQL("b.run_id")
        elif name in ("message_id", "msg_id"):
            value = sql.SQL("CASE WHEN {c} IS NOT NULL THEN %(id_base)s + b.i * %(stride)s + tpl.tpl_k END").format(c=col)
        elif name == "last_worker_id":
            value = sql.SQL("CASE WHEN {c} IS NOT NULL THEN w.worker_id END").format(c=col)
        elif kind == "timestamp with time zone":
            value = sql.SQL("{c} + b.shift").format(c=col)
        elif name == "message" and kind == "jsonb":
            value = sql.SQL("CASE WHEN {c} ? 'run_id' THEN jsonb_set({c}, '{{run_id}}', to_jsonb(b.run_id)) ELSE {c} END"
                            ).format(c=col)
        else:
            value = col
        values.append(value)
    names = sql.SQL(", ").join(sql.Identifier(n) for n, _ in _columns(conn, regclass))
    return sql.SQL("INSERT INTO {t} ({n}) SELECT {v} FROM hist_batch AS b JOIN {tpl} AS tpl ON tpl.tpl_kind = b.kind {j} "
                   "ORDER BY b.i").format(t=table, n=names, v=sql.SQL(", ").join(values), tpl=sql.Identifier(template),
                                          j=sql.SQL(extra_join))


def _queue_tables(conn: psycopg.Connection, queue: str) -> tuple[str, str]:
    row = conn.execute("SELECT pgmq.format_table_name(%s, 'a'), pgmq.format_table_name(%s, 'q')", (queue, queue)).fetchone()
    return row[0], row[1]


def write_history(db: Database, templates: dict[int, str], tasks: int, log: Any) -> dict[str, Any]:
    """Write about ``tasks`` finished tasks of history as copies of ``templates``; returns counts."""
    c = db.conn
    queues = [r.queue for r in db.routes]
    c.execute("CREATE TEMP TABLE hist_kinds (kind int PRIMARY KEY, run_id uuid, origin timestamptz)")
    for kind, run_id in templates.items():
        c.execute("INSERT INTO hist_kinds SELECT %s, run_id, started_at FROM pgflow.runs WHERE run_id = %s", (kind, run_id))
    c.execute("CREATE TEMP TABLE hist_tpl_runs AS SELECT r.*, k.kind AS tpl_kind FROM pgflow.runs AS r "
              "JOIN hist_kinds AS k ON k.run_id = r.run_id")
    c.execute("CREATE TEMP TABLE hist_tpl_states AS SELECT s.*, k.kind AS tpl_kind FROM pgflow.step_states AS s "
              "JOIN hist_kinds AS k ON k.run_id = s.run_id")
    c.execute("CREATE TEMP TABLE hist_tpl_tasks AS SELECT t.*, k.kind AS tpl_kind, "
              "row_number() OVER (PARTITION BY t.run_id, t.queue_name ORDER BY t.message_id) AS tpl_k "
              "FROM pgflow.step_tasks AS t JOIN hist_kinds AS k ON k.run_id = t.run_id")
    widest = c.execute("SELECT max(tpl_k) FROM hist_tpl_tasks").fetchone()[0]
    if widest >= ID_STRIDE:
        raise RuntimeError(f"a template has {widest} tasks in one queue; ID_STRIDE is {ID_STRIDE}")
    per_cycle = sum(c.execute("SELECT count(*) FROM hist_tpl_tasks WHERE tpl_kind = %s", (k,)).fetchone()[0]
                    for k in PATTERN)
    runs = max(len(PATTERN), tasks * len(PATTERN) // per_cycle)
    id_base = 1 + max(c.execute(sql.SQL("SELECT coalesce(max(msg_id), 0) FROM pgmq.{}").format(
        sql.Identifier(_queue_tables(c, q)[0]))).fetchone()[0] for q in queues)
    workers_per_queue = max(1, runs // WORKERS_PER_QUEUE_PER_RUNS)
    params = {"id_base": id_base, "stride": ID_STRIDE, "runs": runs, "span": f"{SPAN_DAYS} days",
              "pattern": list(PATTERN), "workers": workers_per_queue}

    counts = {"runs": runs, "workers": workers_per_queue * len(queues)}
    began = time.perf_counter()
    c.execute("SET session_replication_role = replica")
    try:
        # finished workers: copies of the registered ones, each serving a slice of the 30 days
        c.execute("CREATE TEMP TABLE hist_workers AS SELECT w.queue_name, n, gen_random_uuid() AS worker_id, "
                  "now() - interval '1 hour' - %(span)s::interval * (%(workers)s - n)::float8 / %(workers)s AS started_at "
                  "FROM pgflow.workers AS w, generate_series(0, %(workers)s - 1) AS n "
                  "WHERE w.function_name = 'bench-history'", params)
        c.execute("INSERT INTO pgflow.workers (worker_id, queue_name, function_name, flow_slug, step_slug, started_at, "
                  "stopped_at, last_heartbeat_at, worker_version) "
                  "SELECT h.worker_id, w.queue_name, w.function_name, w.flow_slug, w.step_slug, h.started_at, "
                  "h.started_at + %(span)s::interval / %(workers)s, h.started_at + %(span)s::interval / %(workers)s, "
                  "w.worker_version FROM hist_workers AS h JOIN pgflow.workers AS w ON w.queue_name = h.queue_name "
                  "AND w.function_name = 'bench-history' ORDER BY h.worker_id", params)
        c.execute("CREATE INDEX ON hist_workers (queue_name, n)")
        archives = []
        for queue in queues:
            archive = _queue_tables(c, queue)[0]
            template = f"hist_tpl_{archive}"
            c.execute(sql.SQL("CREATE TEMP TABLE {} AS SELECT a.*, t.tpl_kind, t.tpl_k FROM pgmq.{} AS a "
                              "JOIN hist_tpl_tasks AS t ON t.queue_name = %s AND t.message_id = a.msg_id").format(
                sql.Identifier(template), sql.Identifier(archive)), (queue,))
            archives.append(_copy_statement(c, sql.Identifier("pgmq", archive), f"pgmq.{archive}", template))
        worker_join = ("LEFT JOIN hist_workers AS w ON w.queue_name = tpl.queue_name "
                       "AND w.n = b.i * %(workers)s / %(runs)s")
        statements = [
            _copy_statement(c, sql.SQL("pgflow.runs"), "pgflow.runs", "hist_tpl_runs"),
            _copy_statement(c, sql.SQL("pgflow.step_states"), "pgflow.step_states", "hist_tpl_states"),
            _copy_statement(c, sql.SQL("pgflow.step_tasks"), "pgflow.step_tasks", "hist_tpl_tasks", worker_join),
            *archives,
        ]
        for first in range(0, runs, RUNS_PER_WRITE):
            n = min(RUNS_PER_WRITE, runs - first)
            with c.transaction():
                # numbered in run-id order, so every index of the batch is written in key order
                c.execute("CREATE TEMP TABLE hist_batch ON COMMIT DROP AS "
                          "SELECT x.i, x.run_id, k.kind, (now() - interval '1 hour' - %(span)s::interval "
                          "* (%(runs)s - x.i)::float8 / %(runs)s) - k.origin AS shift "
                          "FROM (SELECT %(first)s + row_number() OVER (ORDER BY u) - 1 AS i, u AS run_id "
                          "      FROM (SELECT gen_random_uuid() AS u FROM generate_series(1, %(n)s)) AS g) AS x "
                          "JOIN hist_kinds AS k ON k.kind = (%(pattern)s::int[])[(x.i %% 10)::int + 1]",
                          {**params, "first": first, "n": n})
                c.execute("ANALYZE hist_batch")
                for statement in statements:
                    c.execute(statement, params)
            if first // RUNS_PER_WRITE % 5 == 4 or first + n >= runs:
                log(f"history_scale: wrote {first + n:,} of {runs:,} runs ({time.perf_counter() - began:.0f}s)")
    finally:
        c.execute("RESET session_replication_role")
    # a live queue's sequence is past every message it ever had
    top = id_base + runs * ID_STRIDE
    for queue in queues:
        c.execute("SELECT setval(pg_get_serial_sequence(%s, 'msg_id'), %s)", (f"pgmq.{_queue_tables(c, queue)[1]}", top))
    counts["seconds"] = round(time.perf_counter() - began, 1)
    orphans = c.execute(
        "SELECT (SELECT count(*) FROM pgflow.step_tasks AS t WHERE NOT EXISTS (SELECT 1 FROM pgflow.step_states AS s "
        "          WHERE s.run_id = t.run_id AND s.step_slug = t.step_slug)) "
        "     + (SELECT count(*) FROM pgflow.step_states AS s WHERE NOT EXISTS (SELECT 1 FROM pgflow.runs AS r "
        "          WHERE r.run_id = s.run_id)) "
        "     + (SELECT count(*) FROM pgflow.step_tasks AS t WHERE t.last_worker_id IS NOT NULL AND NOT EXISTS "
        "          (SELECT 1 FROM pgflow.workers AS w WHERE w.worker_id = t.last_worker_id))").fetchone()[0]
    if orphans:
        raise RuntimeError(f"the history has {orphans} row(s) whose parent row is missing")
    for name in ("DROP TABLE hist_kinds, hist_tpl_runs, hist_tpl_states, hist_tpl_tasks, hist_workers",):
        c.execute(name)
    for queue in queues:
        c.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(f"hist_tpl_{_queue_tables(c, queue)[0]}")))
    return counts


def history_tables(conn: psycopg.Connection) -> list[str]:
    """The history tables: pgflow's runs, step states, tasks and workers, and every PGMQ archive."""
    rows = conn.execute("SELECT format('%%I.%%I', schemaname, relname) FROM pg_stat_user_tables "
                        "WHERE (schemaname = 'pgflow' AND relname = ANY(%s)) OR (schemaname = 'pgmq' AND relname LIKE 'a\\_%%') "
                        "ORDER BY 1", (list(HISTORY_TABLES),)).fetchall()
    return [r[0] for r in rows]


def set_autovacuum(conn: psycopg.Connection, enabled: bool) -> None:
    """Autovacuum off (or back to the server's default) for every pgflow and PGMQ table."""
    for schema, table in conn.execute("SELECT schemaname, relname FROM pg_stat_user_tables "
                                      "WHERE schemaname IN ('pgflow', 'pgmq')").fetchall():
        change = "SET (autovacuum_enabled = false)" if not enabled else "RESET (autovacuum_enabled)"
        conn.execute(sql.SQL("ALTER TABLE {}.{} " + change).format(sql.Identifier(schema), sql.Identifier(table)))


def sizes(conn: psycopg.Connection) -> dict[str, Any]:
    """Rows and ``pg_total_relation_size`` (MB) of every history table, and the database's size (MB)."""
    out: dict[str, Any] = {}
    for table in history_tables(conn):
        rows, size = conn.execute(sql.SQL("SELECT count(*), pg_total_relation_size(%s::regclass) FROM {}").format(
            sql.SQL(table)), (table,)).fetchone()
        out[table] = {"rows": rows, "mb": round(size / 2**20)}
    out["database_mb"] = round(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0] / 2**20)
    return out


SCAN_NODE = re.compile(r"(Seq Scan|Index Scan|Index Only Scan|Bitmap Heap Scan|Bitmap Index Scan)"
                       r"(?: Backward)?(?: using (\S+))? on (\S+).*?\(actual time=\S+ rows=(\d+) loops=(\d+)\)")
REMOVED = re.compile(r"Rows Removed by (?:Filter|Index Recheck|Join Filter): (\d+)")


def scans_of_history(plans: list[str], relations: set[str]) -> dict[str, Any]:
    """The scan nodes of ``plans`` (auto_explain texts with ``log_analyze``) on ``relations`` (tables and
    their indexes, unqualified): those that read more than ``SCAN_LIMIT`` rows (returned and removed by
    a filter, all loops), and how many were sequential scans and the most rows any of those read."""
    found = []
    sequential, most = 0, 0
    for plan in plans:
        statement = next((line.split("Query Text:", 1)[1].strip() for line in plan.splitlines()
                          if "Query Text:" in line), "")[:160]
        lines = plan.splitlines()
        for n, line in enumerate(lines):
            match = SCAN_NODE.search(line)
            if not match:
                continue
            kind, index, relation, rows, loops = match.groups()
            if relation.split(".")[-1] not in relations and (index or "").split(".")[-1] not in relations:
                continue
            removed = 0
            for follow in lines[n + 1:n + 6]:
                if SCAN_NODE.search(follow) or "->" in follow:
                    break
                if m := REMOVED.search(follow):
                    removed += int(m.group(1))
            read = int(rows) * int(loops) + removed
            if kind == "Seq Scan":
                sequential, most = sequential + 1, max(most, read)
            if read > SCAN_LIMIT:
                found.append({"statement": statement, "node": line.strip()[:200], "rows_read": read})
    return {"over_limit": found, "sequential_scans": sequential, "most_rows_by_a_sequential_scan": most}


def explain_batch(db: Database) -> dict[str, Any]:
    """One claim batch of the live flow and its report under ``auto_explain`` (actual rows, nested
    statements); returns how many plans were seen and the scans of history tables they made."""
    c = db.conn
    plans: list[str] = []

    def keep(diagnostic: Any) -> None:
        if diagnostic.message_primary and "Query Text:" in diagnostic.message_primary:
            plans.append(diagnostic.message_primary)

    db.start_live(BATCH)
    ids = db.protocol.read(c, queue_name=db.live.queue, vt=db.read_vt, qty=BATCH, max_poll_seconds=1, poll_interval_ms=10)
    relations = {r[0] for r in c.execute(
        "SELECT c.relname FROM pg_class AS c WHERE c.oid IN (SELECT unnest(%s::regclass[])) "
        "UNION SELECT i.relname FROM pg_index AS x JOIN pg_class AS i ON i.oid = x.indexrelid "
        "WHERE x.indrelid IN (SELECT unnest(%s::regclass[]))", (history_tables(c), history_tables(c))).fetchall()}
    c.execute("LOAD 'auto_explain'")
    for setting, value in (("log_min_duration", "0"), ("log_analyze", "on"), ("log_nested_statements", "on"),
                           ("log_level", "notice")):
        c.execute(sql.SQL("SET auto_explain.{} = {}").format(sql.Identifier(setting), sql.Literal(value)))
    c.add_notice_handler(keep)
    try:
        claimed = db.claim(db.live, ids)
        db.protocol.complete_many(c, [(task, None) for task in claimed])
    finally:
        c.remove_notice_handler(keep)
        c.execute("SET auto_explain.log_min_duration = -1")
        c.execute("SET auto_explain.log_analyze = off")
    db.work_queue(db.live, lambda task: None)  # the rest of the runs, so the next sample starts clean
    return {"plans": len(plans), **scans_of_history(plans, relations),
            "statements": sorted({p.split("Query Text:", 1)[1].strip().split("\n")[0][:100] for p in plans})}


def block_counts(conn: psycopg.Connection) -> dict[str, int]:
    """Cumulative block counts of the connection's database: ``read`` (into shared buffers, from the
    OS) and ``hit`` (found there), the blocks read per pgflow and PGMQ table and index, and the updates
    (``updates:<table>``) and HOT updates (``hot:<table>``) of runs, step states and tasks."""
    conn.execute("SELECT pg_stat_force_next_flush()")  # this backend's own counts, flushed when it idles
    read, hit = conn.execute("SELECT blks_read, blks_hit FROM pg_stat_database WHERE datname = current_database()"
                             ).fetchone()
    out = {"read": int(read), "hit": int(hit)}
    for name, blocks in conn.execute(
            "SELECT relname, heap_blks_read FROM pg_statio_user_tables WHERE schemaname IN ('pgflow', 'pgmq') "
            "UNION ALL SELECT indexrelname, idx_blks_read FROM pg_statio_user_indexes "
            "WHERE schemaname IN ('pgflow', 'pgmq')").fetchall():
        out[name] = int(blocks or 0)
    for name, updates, hot in conn.execute(
            "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = 'pgflow' "
            "AND relname IN ('runs', 'step_states', 'step_tasks')").fetchall():
        out[f"updates:{name}"], out[f"hot:{name}"] = int(updates), int(hot)
    return out


def blocks_per_task(before: dict[str, int], after: dict[str, int], tasks: int, top: int = 8) -> dict[str, Any]:
    """Blocks read and hit per task between two :func:`block_counts`, the relations read most, and the
    share of the updates of runs, step states and tasks that were HOT (no new index entries)."""
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    most = sorted(((k, v) for k, v in delta.items() if ":" not in k and k not in ("read", "hit") and v > 0),
                  key=lambda kv: -kv[1])
    hot = {k.split(":")[1]: round(delta[k] / delta["updates:" + k.split(":")[1]], 2)
           for k in delta if k.startswith("hot:") and delta["updates:" + k.split(":")[1]]}
    return {"read_per_task": round(delta["read"] / tasks, 2), "hit_per_task": round(delta["hit"] / tasks, 1),
            "read_most": {k: round(v / tasks, 2) for k, v in most[:top]}, "hot_update_share": hot}


def _per_task(sample: dict[str, float], tasks: int) -> dict[str, float]:
    """Microseconds per task: wall clock, and backend CPU in all and by call."""
    cpu = sample["read"] + sample["claim"] + sample["complete"]
    return {"wall": 1e6 * sample["seconds"] / tasks, "cpu": 1000 * cpu / tasks,
            "claim": 1000 * sample["claim"] / tasks, "complete": 1000 * sample["complete"] / tasks}


def sample(db: Database, *, analyze: bool) -> dict[str, float]:
    """One sample: ``WARM_RUNS + LIVE_RUNS`` runs of the live flow started (not timed), the tasks of
    ``WARM_RUNS`` of them drained untimed (the connection's plans settle: PL/pgSQL plans a statement
    anew for its first calls after an ``ANALYZE``), then ``3 * LIVE_RUNS`` tasks timed; microseconds
    per task (:func:`_per_task`).

    ``analyze``: ``ANALYZE`` once the runs are started. The empty database needs it: its tables are a
    few pages long, its own samples grow them several times over, and a plan cached when they were
    smaller (a sequential scan of ``runs``) costs more with every sample; autovacuum analyzes a table
    whose rows changed by 10%, so a small live database gets it within a minute. The history
    database keeps the statistics of its load: a sample's tasks are 0.01% of its rows, which
    autovacuum would not analyze for."""
    db.start_live(WARM_RUNS + LIVE_RUNS)
    if analyze:
        db.conn.execute("ANALYZE")
    steps = len(LIVE.steps)
    db.drain_live(WARM_RUNS * steps)
    measured = db.drain_live(LIVE_RUNS * steps)
    db.check_live_done()
    return _per_task(measured, LIVE_RUNS * steps)


def run(ctx: Context) -> list[Result]:
    target = ctx.size(HISTORY_TASKS, minimum=1_000)
    tasks = LIVE_RUNS * len(LIVE.steps)
    keys = ("wall", "cpu", "claim", "complete")
    samples: dict[str, dict[str, list[float]]] = {side: {k: [] for k in keys} for side in ("empty", "history")}
    loads: list[tuple[float, float]] = []
    with contextlib.ExitStack() as stack:
        empty = Database(stack.enter_context(ctx.database("hist_empty")))
        stack.callback(lambda: empty.close())
        big = Database(stack.enter_context(ctx.database("hist_big")))
        stack.callback(lambda: big.close())
        make_templates(empty)
        templates = make_templates(big)
        for db in (empty, big):
            db.start_live(WARM_RUNS)
            db.drain_live(WARM_RUNS * len(LIVE.steps))
            db.conn.execute("ANALYZE")  # both start from the statistics of a small database

        set_autovacuum(big.conn, False)
        load_before_write = os.getloadavg()[0]
        counts = write_history(big, templates, target, ctx.log)
        load_after_write = os.getloadavg()[0]
        ctx.log(f"history_scale: wrote {counts['runs']:,} runs in {counts['seconds']:.0f}s (load {load_before_write:.1f} "
                f"-> {load_after_write:.1f})")

        # before any ANALYZE of the history: a fresh connection on each side, one sample each
        empty.reconnect()
        big.reconnect()
        cold_empty = sample(empty, analyze=True)
        cold_big = sample(big, analyze=False)
        ctx.log(f"history_scale before ANALYZE: empty {cold_empty['wall']:.0f} / history {cold_big['wall']:.0f} us per task, "
                f"backend CPU {cold_empty['cpu']:.0f} / {cold_big['cpu']:.0f}")

        began = time.perf_counter()
        tables = history_tables(big.conn)
        for table in tables:
            big.conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.SQL(table)))
        big.conn.execute("ANALYZE")
        set_autovacuum(big.conn, True)
        vacuum_seconds = round(time.perf_counter() - began, 1)
        table_sizes = sizes(big.conn)
        history_rows = table_sizes["pgflow.step_tasks"]["rows"]
        ctx.log(f"history_scale: VACUUM ANALYZE {vacuum_seconds:.0f}s; {history_rows:,} tasks, database "
                f"{table_sizes['database_mb']:,} MB; " + ", ".join(
                    f"{t} {v['rows']:,} rows {v['mb']:,} MB" for t, v in table_sizes.items() if isinstance(v, dict)))
        blocks = {side: block_counts(db.conn) for side, db in (("empty", empty), ("history", big))}
        for i in range(ctx.repeat):
            load = os.getloadavg()[0]
            for side, db in (("empty", empty), ("history", big)):
                for key, value in sample(db, analyze=side == "empty").items():
                    samples[side][key].append(value)
            loads.append((load, os.getloadavg()[0]))
            ctx.log(f"history_scale {i + 1}/{ctx.repeat}: empty {samples['empty']['wall'][-1]:.0f} / history "
                    f"{samples['history']['wall'][-1]:.0f} us per task, backend CPU {samples['empty']['cpu'][-1]:.0f} / "
                    f"{samples['history']['cpu'][-1]:.0f} (claim {samples['empty']['claim'][-1]:.0f} / "
                    f"{samples['history']['claim'][-1]:.0f}, complete {samples['empty']['complete'][-1]:.0f} / "
                    f"{samples['history']['complete'][-1]:.0f}); load {loads[-1][0]:.1f} -> {loads[-1][1]:.1f}")
        # every task of the rounds, the untimed warm-up ones too
        round_tasks = ctx.repeat * (WARM_RUNS + LIVE_RUNS) * len(LIVE.steps)
        io = {side: blocks_per_task(blocks[side], block_counts(db.conn), round_tasks)
              for side, db in (("empty", empty), ("history", big))}
        ctx.log(f"history_scale: blocks read into shared buffers per task: empty {io['empty']['read_per_task']}, "
                f"history {io['history']['read_per_task']} (most: {io['history']['read_most']}); hit: "
                f"{io['empty']['hit_per_task']} / {io['history']['hit_per_task']}; HOT share of updates: empty "
                f"{io['empty']['hot_update_share']}, history {io['history']['hot_update_share']}")
        # the plans the warm connection uses by now (generic or custom, as a long-lived worker's)
        plans = explain_batch(big)
        for scan in plans["over_limit"]:
            ctx.log(f"history_scale plan: {scan['rows_read']:,} rows by {scan['node']} in {scan['statement']}")
        ctx.log(f"history_scale: {plans['plans']} plans checked, {len(plans['over_limit'])} scan(s) of a history table "
                f"read more than {SCAN_LIMIT:,} rows; sequential scans of one: {plans['sequential_scans']} (at most "
                f"{plans['most_rows_by_a_sequential_scan']:,} rows)")

    details = {"lower_is_better": True, "batch": BATCH, "live_runs": LIVE_RUNS, "history_tasks": history_rows,
               "history_runs": counts["runs"], "generation_seconds": counts["seconds"], "vacuum_analyze_seconds":
               vacuum_seconds, "sizes": table_sizes, "load_at_generation": [load_before_write, load_after_write],
               "load_per_round": loads, "plans": plans, "blocks": io, "goal": "<= 1.2x"}
    label = f"{history_rows:,} finished tasks"
    names = {"wall": ("read + claim + complete per task", "us/task", {}),
             "cpu": ("read + claim + complete per task (backend CPU)", "us/task", {"clock": "schedstat"}),
             "claim": ("claim per task (backend CPU)", "us/task", {"clock": "schedstat"}),
             "complete": ("complete per task (backend CPU)", "us/task", {"clock": "schedstat"})}
    results = []
    for key, (what, unit, extra) in names.items():
        base = f"empty history: {what}"
        results += [Result(base, unit, samples["empty"][key], work=tasks, details={**details, **extra}),
                    Result(f"{label}: {what}", unit, samples["history"][key], work=tasks, baseline=base,
                           details={**details, **extra})]
    for key in ("wall", "cpu"):
        what = names[key][0]
        base = f"empty history, fresh connection: {what}"
        results += [Result(base, "us/task", [cold_empty[key]], work=tasks),
                    Result(f"{label} before ANALYZE, fresh connection: {what}", "us/task", [cold_big[key]], work=tasks,
                           baseline=base)]
    return results

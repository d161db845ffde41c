"""Pruning finished history beside live workers, and what finished history costs live work.

One sample (fresh database): ``WORKERS`` real ``pgflow worker`` processes of the 3-step plain flow of
bench/benchmarks/_many_flows.py register and warm up. Then, interleaved in the same database:

1. **empty**: ``LIVE_RUNS`` runs are started in one transaction and drained (timed, tasks/s) with no
   finished history in the tables;
2. **history**: ``HISTORY_RUNS`` finished runs 40 days old are written in bulk (copies of the warm-up's
   real rows: runs, step states, tasks, and the archived messages of the flow's queue, 3 per run,
   foreign-key triggers off while they are written),
   ANALYZEd, and the same ``LIVE_RUNS`` are drained again (timed). Cost ratio: empty rate / history
   rate, the issue's "claim and complete cost stay flat" (goal <= 1.2x, i.e. history >= 0.83x of empty);
3. **prune**: ``pgflow prune --older-than 30d --yes --format json`` (the real command, its default
   batch size) runs while the workers drain a live backlog kept at 100-300 runs; timed (runs
   pruned/s). A sampler looks every 10 ms at every worker backend waiting for a lock and keeps the
   longest such statement's elapsed time (``clock_timestamp() - query_start``: an upper bound of the
   wait, since the statement may have run before it waited); bench/benchmarks/many_workers.py's lock
   sampler gives the full picture. It also keeps the longest of the waits that a prune batch blocked
   (a session blocking the waiter runs ``pgflow.prune_*``): the other waits are the workers' own (a
   claim behind another worker's long poll, docs/scaling.md). Deadlocks and the workers' warnings and
   errors are counted.
4. **after**: ``VACUUM ANALYZE``, and the same ``LIVE_RUNS`` drained once more, with the history gone.
   The drains run in a fixed order (empty, history, after), so the history drain is compared with both
   neighbours: a drift with the order of the drains shows as two different ratios.

Acceptance of issue 28 item 4: pruning 1M finished runs beside 8 live workers, no worker error,
longest worker wait < 100 ms. ``--scale`` scales ``HISTORY_RUNS``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg
from psycopg import sql

from bench.benchmarks.many_workers import MONITOR, ROOT, LockSampler, WorkerProcesses, _drained, _start, _wait
from bench.core import Context, Result

WORKERS = 8
HISTORY_RUNS = 1_000_000
LIVE_RUNS = 1_500
OLD = "40 days"

OVERRIDES = {
    "pgflow.runs": {"run_id": "b.run_id", "started_at": "now() - interval '40 days'",
                    "completed_at": "now() - interval '40 days' + interval '1 second'"},
    "pgflow.step_states": {"run_id": "b.run_id", "created_at": "now() - interval '40 days'",
                           "started_at": "now() - interval '40 days'",
                           "completed_at": "now() - interval '40 days' + interval '1 second'"},
    "pgflow.step_tasks": {"run_id": "b.run_id", "message_id": "1000000000000 + b.i * 10 + tpl.k",
                          "last_worker_id": "NULL", "queued_at": "now() - interval '40 days'",
                          "started_at": "now() - interval '40 days'",
                          "completed_at": "now() - interval '40 days' + interval '1 second'"},
    "pgmq.a_manyplain": {"msg_id": "1000000000000 + b.i * 10 + tpl.k", "archived_at": "now() - interval '40 days'"},
}
"""Per table, the columns a copy of a template row gets new values for (``b``: the new run, ``tpl``: the row)."""
TEMPLATES = {
    "pgflow.runs": "SELECT r.*, 1 AS k FROM pgflow.runs AS r WHERE r.run_id = %(tpl)s",
    "pgflow.step_states": "SELECT s.*, 1 AS k FROM pgflow.step_states AS s WHERE s.run_id = %(tpl)s",
    "pgflow.step_tasks": "SELECT t.*, row_number() OVER (ORDER BY t.step_slug) AS k FROM pgflow.step_tasks AS t "
                         "WHERE t.run_id = %(tpl)s",
    "pgmq.a_manyplain": "SELECT a.*, row_number() OVER (ORDER BY a.msg_id) AS k FROM "
                        "(SELECT * FROM pgmq.a_manyplain ORDER BY msg_id LIMIT 3) AS a",
}


def write_history(conn: psycopg.Connection, first: int, n: int, template: Any) -> None:
    """``n`` copies of the finished run ``template`` (and of 3 archived messages), 40 days old, in bulk;
    numbered from ``first`` (their message ids come from the number).

    Foreign-key triggers are off for the session (``session_replication_role = replica``, the bench
    server's superuser): the copies are consistent by construction, and checking them would only slow
    the build of the history, which is not what is measured."""
    conn.execute("SET session_replication_role = replica")
    try:
        with conn.transaction():
            conn.execute("CREATE TEMP TABLE bench_ids AS SELECT gen_random_uuid() AS run_id, i "
                         "FROM generate_series(%s::bigint, %s::bigint) AS i", (first, first + n - 1))
            for table, overrides in OVERRIDES.items():
                schema, name = table.split(".")
                columns = [r[0] for r in conn.execute(
                    "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                    "AND NOT attisdropped ORDER BY attnum", (table,)).fetchall()]
                values = sql.SQL(", ").join(sql.SQL(overrides[c]) if c in overrides else sql.SQL("tpl.{}").format(
                    sql.Identifier(c)) for c in columns)
                conn.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM bench_ids AS b, ({}) AS tpl").format(
                    sql.Identifier(schema, name), sql.SQL(", ").join(map(sql.Identifier, columns)), values,
                    sql.SQL(TEMPLATES[table])), {"tpl": template})
            conn.execute("DROP TABLE bench_ids")
    finally:
        conn.execute("RESET session_replication_role")


WAITING_WORKERS = """
SELECT coalesce(max(w.elapsed), 0), coalesce(max(w.elapsed) FILTER (WHERE w.behind_prune), 0)
FROM (SELECT extract(epoch FROM clock_timestamp() - a.query_start) AS elapsed,
             EXISTS (SELECT 1 FROM pg_stat_activity AS b
                     WHERE b.pid = ANY (pg_blocking_pids(a.pid)) AND b.query LIKE '%%pgflow.prune_%%') AS behind_prune
      FROM pg_stat_activity AS a
      WHERE a.datname = current_database() AND a.wait_event_type = 'Lock'
        AND a.application_name IS DISTINCT FROM %(monitor)s AND a.query NOT LIKE '%%prune_%%') AS w
"""


class LongestWait(threading.Thread):
    """Every 10 ms: the longest elapsed time of a worker statement seen waiting for a lock (``longest``),
    and of one waiting behind a prune batch (``behind_prune``: a session blocking it runs pgflow.prune_*)."""

    def __init__(self, conninfo: str) -> None:
        super().__init__(daemon=True)
        self.conn = psycopg.connect(conninfo, autocommit=True, application_name=MONITOR)
        self.longest = 0.0
        self.behind_prune = 0.0
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                any_wait, prune_wait = self.conn.execute(WAITING_WORKERS, {"monitor": MONITOR}).fetchone()
                self.longest = max(self.longest, float(any_wait))
                self.behind_prune = max(self.behind_prune, float(prune_wait))
                self.halt.wait(0.01)
        finally:
            self.conn.close()


def _timed_drain(conn: psycopg.Connection) -> float:
    before = conn.execute("SELECT count(*) FROM pgflow.step_tasks").fetchone()[0]
    with conn.transaction():
        _start(conn, "plain", LIVE_RUNS)
    began = time.perf_counter()
    _drained(conn)
    seconds = time.perf_counter() - began
    return (conn.execute("SELECT count(*) FROM pgflow.step_tasks").fetchone()[0] - before) / seconds


def sample(ctx: Context, history: int) -> dict[str, Any]:
    with ctx.database("prune") as conninfo, psycopg.connect(conninfo, autocommit=True, application_name=MONITOR) as conn:
        deadlocks_before = conn.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").fetchone()[0]
        fleet = WorkerProcesses("plain", conninfo, WORKERS)
        try:
            _wait(conn, "SELECT count(*) = %s FROM pgflow.workers WHERE stopped_at IS NULL", (WORKERS,), "workers")
            _start(conn, "plain", 60)
            _drained(conn)
            conn.execute("ANALYZE")
            load_empty = os.getloadavg()[0]
            empty = _timed_drain(conn)
            template = conn.execute("SELECT run_id FROM pgflow.runs WHERE status = 'completed' LIMIT 1").fetchone()[0]
            began = time.perf_counter()
            for chunk in range(0, history, 100_000):
                write_history(conn, chunk + 1, min(100_000, history - chunk), template)
            conn.execute("ANALYZE")
            build = time.perf_counter() - began
            ctx.log(f"wrote {history:,} finished runs in {build:.0f}s")
            load_full = os.getloadavg()[0]
            full = _timed_drain(conn)

            sampler, longest = LockSampler(conninfo), LongestWait(conninfo)
            sampler.start()
            longest.start()
            load_prune = os.getloadavg()[0]
            env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "DATABASE_URL"}
            prune = subprocess.Popen([sys.executable, "-m", "pgflow_cli", "prune", "--older-than", "30d", "--yes",
                                      "--format", "json", "--dsn", conninfo], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            began = time.perf_counter()
            while prune.poll() is None:
                backlog = conn.execute("SELECT count(*) FROM pgflow.runs WHERE status = 'started'").fetchone()[0]
                if backlog < 100:
                    _start(conn, "plain", 200)
                time.sleep(0.05)  # the benchmark's feeding interval, not a wait for a state
            prune_seconds = time.perf_counter() - began
            out, err = prune.communicate()
            _drained(conn)
            summary = sampler.finish()
            longest.halt.set()
            longest.join(30)
            conn.execute("VACUUM ANALYZE")
            load_after = os.getloadavg()[0]
            after = _timed_drain(conn)
        finally:
            codes, problems = fleet.stop()
        deadlocks = conn.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
                                 ).fetchone()[0] - deadlocks_before
    if prune.returncode != 0:
        raise RuntimeError(f"pgflow prune exited {prune.returncode}: {err[-2000:]}")
    doc = json.loads(out)
    ctx.log(f"empty {empty:,.0f} tasks/s (load {load_empty:.1f}), with {history:,} runs {full:,.0f} tasks/s "
            f"(load {load_full:.1f}); prune {doc['deleted']['runs']:,} runs in {prune_seconds:.1f}s, longest worker "
            f"lock wait <= {longest.longest * 1000:.0f} ms (behind a prune batch <= {longest.behind_prune * 1000:.0f} ms), "
            f"deadlocks {deadlocks}, worker problems {len(problems)}, "
            f"exits {codes}, load {load_prune:.1f}; after the prune {after:,.0f} tasks/s (load {load_after:.1f})")
    return {"empty": empty, "full": full, "after": after, "prune_rate": doc["deleted"]["runs"] / prune_seconds,
            "prune_seconds": prune_seconds, "longest_wait_ms": round(longest.longest * 1000, 1),
            "longest_wait_behind_prune_ms": round(longest.behind_prune * 1000, 1),
            "deadlocks": deadlocks, "problems": problems, "exits": codes, "deleted": doc["deleted"],
            "build_seconds": round(build, 1), "locks": summary.to_dict(top=5),
            "loads": [round(load_empty, 2), round(load_full, 2), round(load_prune, 2), round(load_after, 2)]}


def run(ctx: Context) -> list[Result]:
    history = ctx.size(HISTORY_RUNS, minimum=1_000)
    samples = [sample(ctx, history) for _ in range(ctx.repeat)]
    details = {"worker_processes": WORKERS, "history_runs": history, "history_tasks": history * 3,
               "live_runs": LIVE_RUNS, "longest_worker_lock_wait_ms": [s["longest_wait_ms"] for s in samples],
               "longest_worker_wait_behind_prune_ms": [s["longest_wait_behind_prune_ms"] for s in samples],
               "deadlocks": sum(s["deadlocks"] for s in samples),
               "worker_warnings_and_errors": sum(len(s["problems"]) for s in samples),
               "first_worker_problems": [p for s in samples for p in s["problems"]][:5],
               "worker_exit_codes": sorted({c for s in samples for c in s["exits"]}, key=str),
               "prune_seconds": [round(s["prune_seconds"], 1) for s in samples],
               "deleted": samples[-1]["deleted"], "build_seconds": [s["build_seconds"] for s in samples],
               "load_average_per_sample": [s["loads"] for s in samples], "locks_last_sample": samples[-1]["locks"]}
    empty = f"plain flow drained by {WORKERS} workers, empty history"
    after = f"plain flow drained by {WORKERS} workers, after the prune (VACUUM ANALYZE)"
    full = f"plain flow drained by {WORKERS} workers, {history:,} finished runs in the tables"
    return [
        Result(empty, "tasks/s", [s["empty"] for s in samples], work=LIVE_RUNS * 3, details=details),
        Result(full, "tasks/s", [s["full"] for s in samples], work=LIVE_RUNS * 3, baseline=empty),
        Result(after, "tasks/s", [s["after"] for s in samples], work=LIVE_RUNS * 3),
        Result(full + " (against the drain after the prune)", "tasks/s", [s["full"] for s in samples],
               work=LIVE_RUNS * 3, baseline=after),
        Result(f"pgflow prune of {history:,} finished runs beside {WORKERS} live workers", "runs/s",
               [s["prune_rate"] for s in samples], work=history, details=details),
    ]

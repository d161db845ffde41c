"""Many worker processes on one database: throughput, lock waits and deadlocks, directly and through
PgBouncer.

Each sample (fresh database) starts N real ``pgflow worker`` processes (the command line's reference
worker, ``--concurrency 10``: 10 handler slots, claims of up to 10) of one of two flows from
bench/benchmarks/_many_flows.py, whose handlers do nothing:

* ``plain``: a 3-step linear flow, ``PLAIN_RUNS`` runs (3 tasks each, one after the other);
* ``map``: a root map over a ``MAP_SIZE``-element array and one step after it: one run whose
  10,000 tasks all belong to the same run and the same step state.

The workers register and take a warm-up (60 plain runs, or a 200-element map) through their pools;
the database is ANALYZEd while they idle. Then the work is started in one transaction (not timed).
Timed: from its commit until a monitor connection, looking every 20 ms, sees no run started. The
rate is tasks per second (every task of the timed runs). N is 1, 2, 4 and 8; also 8 through a
PgBouncer in transaction mode (``pool_size`` 20 server connections, PgBouncer's default, started
once; the workers connect to its Unix socket as the direct ones connect to the server's).

While the work drains, a sampler connection looks every ``SAMPLE_EVERY`` s at the database's
backends (``pg_stat_activity``) and at every lock not granted (``pg_locks``): what each waiter
waits for (a row lock shows as a ``tuple`` lock, or as a ``transactionid`` wait while the waiter
holds the row's ``tuple`` lock: both are reported with the row's relation, and the row itself is
named for ``runs``, ``step_states`` and ``step_tasks``), and the waiter's statement (the function
its top-level statement calls). Per result the details give: the share of busy backend looks that
were lock waits, the waits by kind, relation and statement, the rows waited for most, the most
frequent wait events of all busy backends, the peak number of busy and of connected backends, the
deadlocks (``pg_stat_database.deadlocks``, read after the workers exited) and the warnings and
errors the workers logged.

Samples are interleaved: per repetition, plain 1, 2, 4, 8, 8 through PgBouncer, then the same for
the map. Ratios: N processes against 1 process, PgBouncer against direct (issue 28's goal >= 0.9x).
On a machine with fewer cores than workers the processes compete with the server for CPU; read
the lock figures for what serialises, the ratios for what it costs here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import Jsonb

from bench.benchmarks._many_flows import MAPPED, PLAIN
from bench.core import Context, Result
from pgflow_cli.sandbox.pooler import LocalPooler, find_pgbouncer

ROOT = Path(__file__).resolve().parents[2]
WORKER_COUNTS = (1, 2, 4, 8)
CONCURRENCY = 10
"""Handler slots per worker process (``pgflow worker``'s default)."""
PLAIN_RUNS = 3_000
MAP_SIZE = 10_000
POOL_SIZE = 20
"""PgBouncer's server connections per database and user (its default ``default_pool_size``)."""
SAMPLE_EVERY = 0.01
"""Seconds between two looks of the lock sampler."""
MONITOR = "pgflow-bench monitor"
"""application_name of the benchmark's own connections (left out of every count)."""
DEADLINE = 900.0
"""Seconds a sample may take before the benchmark gives up (a hang guard)."""

WAITS = """
SELECT a.pid, a.wait_event_type, a.wait_event, a.state, a.query,
       w.locktype, w.mode,
       coalesce(w.relation, h.relation)::regclass::text AS relation,
       coalesce(w.page, h.page) AS page, coalesce(w.tuple, h.tuple) AS tuple,
       CASE WHEN coalesce(w.relation, h.relation) = 'pgflow.runs'::regclass
              THEN (SELECT 'run ' || left(r.run_id::text, 8) FROM pgflow.runs AS r
                    WHERE r.ctid = pg_catalog.format('(%%s,%%s)', coalesce(w.page, h.page), coalesce(w.tuple, h.tuple))::tid)
            WHEN coalesce(w.relation, h.relation) = 'pgflow.step_states'::regclass
              THEN (SELECT 'step state ' || left(s.run_id::text, 8) || '/' || s.step_slug FROM pgflow.step_states AS s
                    WHERE s.ctid = pg_catalog.format('(%%s,%%s)', coalesce(w.page, h.page), coalesce(w.tuple, h.tuple))::tid)
            WHEN coalesce(w.relation, h.relation) = 'pgflow.step_tasks'::regclass
              THEN (SELECT 'task ' || left(t.run_id::text, 8) || '/' || t.step_slug || '[' || t.task_index || ']'
                    FROM pgflow.step_tasks AS t
                    WHERE t.ctid = pg_catalog.format('(%%s,%%s)', coalesce(w.page, h.page), coalesce(w.tuple, h.tuple))::tid)
       END AS row_label,
       CASE WHEN w.pid IS NOT NULL THEN
         (SELECT pg_catalog.string_agg(DISTINCT coalesce(b.state, '?') || ' ' || b.query, ' | ')
          FROM pg_catalog.pg_stat_activity AS b WHERE b.pid = ANY (pg_catalog.pg_blocking_pids(a.pid)))
       END AS blockers
FROM pg_catalog.pg_stat_activity AS a
LEFT JOIN pg_catalog.pg_locks AS w ON w.pid = a.pid AND NOT w.granted
LEFT JOIN LATERAL (SELECT t.relation, t.page, t.tuple FROM pg_catalog.pg_locks AS t
                   WHERE t.pid = a.pid AND t.locktype = 'tuple' AND t.granted LIMIT 1) AS h
       ON w.locktype = 'transactionid'
WHERE a.datname = current_database() AND a.backend_type = 'client backend'
  AND a.application_name IS DISTINCT FROM %(monitor)s AND a.pid <> pg_catalog.pg_backend_pid()
"""
_CALLED = re.compile(r"\b(pgflow|pgmq)\.([a-z_]+)\s*\(")


def statement_of(query: str | None) -> str:
    """The function a top-level statement calls (``pgflow.claim_tasks``), else its first words."""
    if not query:
        return "-"
    match = _CALLED.search(query)
    return f"{match.group(1)}.{match.group(2)}" if match else " ".join(query.split()[:4])


def _blocking(blockers: str | None) -> str:
    """The blocking sessions' states and statements, as ``state statement`` joined with ``|``."""
    if not blockers:
        return "-"
    described = set()
    for one in blockers.split(" | "):
        state, _, query = one.partition(" ")
        described.add(f"{state} {statement_of(query)}")
    return " | ".join(sorted(described))


@dataclass
class LockSummary:
    """What the sampler saw in one or more samples (merged with :meth:`add`)."""

    looks: int = 0
    busy: int = 0
    """Backend looks that found a backend busy (active, or idle in a transaction; not sleeping in a long poll)."""
    lock_waits: int = 0
    """Backend looks that found a backend waiting for a heavyweight lock."""
    looks_with_waits: int = 0
    by_wait: Counter = field(default_factory=Counter)
    """(kind, relation, statement) -> backend looks."""
    rows: Counter = field(default_factory=Counter)
    """(relation, row) -> backend looks waiting for it."""
    blockers: Counter = field(default_factory=Counter)
    """(waiter's statement, what the sessions blocking it were doing) -> backend looks."""
    events: Counter = field(default_factory=Counter)
    """wait event of busy backends ("CPU" when none) -> backend looks."""
    peak_busy: int = 0
    peak_connected: int = 0
    peak_polling: int = 0
    """Most backends seen at once sleeping in a worker's long poll (``pgmq.read_with_poll``)."""

    def add(self, other: LockSummary) -> None:
        self.looks += other.looks
        self.busy += other.busy
        self.lock_waits += other.lock_waits
        self.looks_with_waits += other.looks_with_waits
        self.by_wait.update(other.by_wait)
        self.rows.update(other.rows)
        self.blockers.update(other.blockers)
        self.events.update(other.events)
        self.peak_busy = max(self.peak_busy, other.peak_busy)
        self.peak_connected = max(self.peak_connected, other.peak_connected)
        self.peak_polling = max(self.peak_polling, other.peak_polling)

    def to_dict(self, top: int = 8) -> dict[str, Any]:
        share = self.lock_waits / self.busy if self.busy else 0.0
        return {
            "looks": self.looks,
            "looks_with_lock_waits_pct": round(100.0 * self.looks_with_waits / self.looks, 1) if self.looks else 0.0,
            "busy_backend_looks": self.busy,
            "lock_wait_share_of_busy_pct": round(100.0 * share, 1),
            "mean_lock_waiters_per_look": round(self.lock_waits / self.looks, 2) if self.looks else 0.0,
            "lock_waits": [{"kind": k, "relation": r, "statement": s, "backend_looks": n,
                            "pct_of_lock_waits": round(100.0 * n / self.lock_waits, 1)}
                           for (k, r, s), n in self.by_wait.most_common(top)],
            "distinct_rows_waited_for": len(self.rows),
            "rows_waited_for_most": [{"relation": rel, "row": row, "backend_looks": n}
                                     for (rel, row), n in self.rows.most_common(top)],
            "waiters_blocked_by": [{"waiter": w, "blockers": b, "backend_looks": n}
                                   for (w, b), n in self.blockers.most_common(top)],
            "busy_wait_events": [{"event": e, "backend_looks": n, "pct_of_busy": round(100.0 * n / self.busy, 1)}
                                 for e, n in self.events.most_common(top)],
            "peak_busy_backends": self.peak_busy,
            "peak_connected_backends": self.peak_connected,
            "peak_backends_in_long_polls": self.peak_polling,
        }


class LockSampler(threading.Thread):
    """Looks at the database's backends and lock waits every ``SAMPLE_EVERY`` s until stopped."""

    def __init__(self, conninfo: str) -> None:
        super().__init__(name="lock-sampler", daemon=True)
        self.conn = psycopg.connect(conninfo, autocommit=True, application_name=MONITOR)
        self.summary = LockSummary()
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                self._look()
                self._halt.wait(SAMPLE_EVERY)
        finally:
            self.conn.close()

    def _look(self) -> None:
        rows = self.conn.execute(WAITS, {"monitor": MONITOR}).fetchall()
        s = self.summary
        s.looks += 1
        connected = {r[0] for r in rows}
        # a worker's long poll sleeps inside pgmq.read_with_poll: it holds a connection, not work
        polling = {r[0] for r in rows if r[2] == "PgSleep" and statement_of(r[4]) == "pgmq.read_with_poll"}
        busy = {r[0] for r in rows if r[3] in ("active", "idle in transaction")} - polling
        s.peak_connected = max(s.peak_connected, len(connected))
        s.peak_busy = max(s.peak_busy, len(busy))
        s.peak_polling = max(s.peak_polling, len(polling))
        s.busy += len(busy)
        waiting: set[int] = set()
        for pid, _event_type, _event, _state, query, locktype, _mode, relation, page, tup, row_label, blockers in rows:
            if pid not in busy or locktype is None:
                continue
            waiting.add(pid)
            s.by_wait[(locktype, relation or "-", statement_of(query))] += 1
            s.blockers[(statement_of(query), _blocking(blockers))] += 1
            if locktype in ("tuple", "transactionid") and relation:  # a row lock: which row
                s.rows[(relation, row_label or f"ctid ({page},{tup})")] += 1
        for pid, event_type, event, *_ in {r[0]: r for r in rows}.values():
            if pid in busy:
                s.events[f"{event_type}:{event}" if event_type else "CPU"] += 1
        s.lock_waits += len(waiting)
        s.looks_with_waits += bool(waiting)

    def finish(self) -> LockSummary:
        self._halt.set()
        self.join(60)
        return self.summary


class WorkerProcesses:
    """N ``pgflow worker`` processes of one flow (the real command line), stopped with SIGTERM."""

    def __init__(self, flow_attr: str, conninfo: str, n: int) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k not in ("DATABASE_URL",)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "pgflow_cli", "worker", f"bench.benchmarks._many_flows:{flow_attr}",
                 "--dsn", conninfo, "--concurrency", str(CONCURRENCY), "--log-level", "warning"],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                text=True)
            for _ in range(n)
        ]

    def stop(self) -> tuple[list[int | None], list[str]]:
        """SIGTERM all, wait; their exit codes and the warning and error lines they logged."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        problems: list[str] = []
        for proc in self.procs:
            try:
                _, err = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            codes.append(proc.returncode)
            problems += [line for line in (err or "").splitlines() if " WARNING " in line or " ERROR " in line]
        return codes, problems


def _wait(conn: psycopg.Connection, sql: str, params: tuple[Any, ...], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not conn.execute(sql, params).fetchone()[0]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what}")
        time.sleep(0.02)


def _start(conn: psycopg.Connection, kind: str, size: int) -> None:
    if kind == "plain":
        conn.execute("SELECT count(*) FROM generate_series(1, %s) AS i, "
                     "LATERAL pgflow.start_flow(%s, jsonb_build_object('i', i))", (size, PLAIN))
    else:
        conn.execute("SELECT pgflow.start_flow(%s, %s)", (MAPPED, Jsonb(list(range(size)))))


def _drained(conn: psycopg.Connection) -> None:
    _wait(conn, "SELECT NOT EXISTS (SELECT 1 FROM pgflow.runs WHERE status = 'started')", (), "the runs to end")


def sample(ctx: Context, kind: str, n: int, size: int, pooler: LocalPooler | None) -> tuple[float, dict[str, Any]]:
    """One timed drain by ``n`` worker processes (through ``pooler`` when given); tasks/s and details."""
    flow_attr, flow_slug = ("plain", PLAIN) if kind == "plain" else ("mapped", MAPPED)
    with ctx.database(f"many_{kind}_{n}{'_pgb' if pooler else ''}") as conninfo, \
            psycopg.connect(conninfo, autocommit=True, application_name=MONITOR) as conn:
        dsn = pooler.conninfo(conninfo_to_dict(conninfo)["dbname"], tcp=False) if pooler else conninfo
        deadlocks_before = conn.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
                                        ).fetchone()[0]
        fleet = WorkerProcesses(flow_attr, dsn, n)
        try:
            _wait(conn, "SELECT count(*) = %s FROM pgflow.workers WHERE stopped_at IS NULL AND function_name = %s",
                  (n, f"{flow_slug}-worker"), f"{n} workers to register")
            _start(conn, kind, 60 if kind == "plain" else 200)  # warm-up: every worker's pool, plans, caches
            _drained(conn)
            conn.execute("ANALYZE")
            tasks_before = conn.execute("SELECT count(*) FROM pgflow.step_tasks").fetchone()[0]
            load = os.getloadavg()[0]
            sampler = LockSampler(conninfo)
            with conn.transaction():
                _start(conn, kind, size)
            began = time.perf_counter()  # the workers see the work from the commit on
            sampler.start()
            _drained(conn)
            seconds = time.perf_counter() - began
            summary = sampler.finish()
        finally:
            codes, problems = fleet.stop()
        tasks = conn.execute("SELECT count(*) FROM pgflow.step_tasks").fetchone()[0] - tasks_before
        deadlocks = conn.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
                                 ).fetchone()[0] - deadlocks_before
    ctx.log(f"{kind} x{n}{' via PgBouncer' if pooler else ''}: {tasks} tasks in {seconds:.2f}s = "
            f"{tasks / seconds:,.0f}/s; lock waits {summary.to_dict()['lock_wait_share_of_busy_pct']}% of busy looks; "
            f"deadlocks {deadlocks}; worker warnings {len(problems)}; exits {codes}; load {load:.1f}")
    return tasks / seconds, {"summary": summary, "deadlocks": deadlocks, "problems": problems, "exit_codes": codes,
                             "tasks": tasks, "seconds": seconds, "load": load}


@dataclass
class Series:
    """The samples of one result and what they saw."""

    name: str
    baseline: str | None
    samples: list[float] = field(default_factory=list)
    locks: LockSummary = field(default_factory=LockSummary)
    deadlocks: int = 0
    problems: list[str] = field(default_factory=list)
    exits: list[int | None] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)
    work: int = 0

    def record(self, rate: float, seen: dict[str, Any]) -> None:
        self.samples.append(rate)
        self.locks.add(seen["summary"])
        self.deadlocks += seen["deadlocks"]
        self.problems += seen["problems"]
        self.exits += seen["exit_codes"]
        self.loads.append(round(seen["load"], 2))
        self.work = seen["tasks"]


def _label(kind: str, n: int, size: int, pooled: bool = False) -> str:
    what = f"plain 3-step flow ({size:,} runs)" if kind == "plain" else f"{size:,}-task map"
    processes = "1 worker process" if n == 1 else f"{n} worker processes"
    return f"{what}, {processes}" + (" through PgBouncer" if pooled else "")


def run(ctx: Context) -> list[Result]:
    sizes = {"plain": ctx.size(PLAIN_RUNS, minimum=30), "map": ctx.size(MAP_SIZE, minimum=100)}
    pooler: LocalPooler | None = None
    top = max(WORKER_COUNTS)
    if find_pgbouncer():
        base = Path(tempfile.mkdtemp(prefix="pgflow-bench-pgb-", dir="/tmp"))
        pooler = LocalPooler(base, ctx.server, pool_mode="transaction", pool_size=POOL_SIZE)
        pooler.start()
    else:
        ctx.log("no pgbouncer binary: the PgBouncer results are left out")
    series: dict[tuple[str, int, bool], Series] = {}
    for kind in ("plain", "map"):
        for n in WORKER_COUNTS:
            series[(kind, n, False)] = Series(_label(kind, n, sizes[kind]),
                                              None if n == 1 else _label(kind, 1, sizes[kind]))
        if pooler:
            series[(kind, top, True)] = Series(_label(kind, top, sizes[kind], True), _label(kind, top, sizes[kind]))
    try:
        for repetition in range(ctx.repeat):
            ctx.log(f"repetition {repetition + 1}/{ctx.repeat}")
            for kind in ("plain", "map"):
                for n in WORKER_COUNTS:
                    series[(kind, n, False)].record(*sample(ctx, kind, n, sizes[kind], None))
                if pooler:
                    series[(kind, top, True)].record(*sample(ctx, kind, top, sizes[kind], pooler))
    finally:
        if pooler:
            pooler.destroy()
    results = []
    for (kind, n, pooled), s in series.items():
        results.append(Result(
            s.name, "tasks/s", s.samples, work=s.work, baseline=s.baseline,
            details={"flow": kind, "worker_processes": n, "concurrency_per_process": CONCURRENCY,
                     "through_pgbouncer": pooled, "pgbouncer_pool_size": POOL_SIZE if pooled else None,
                     "deadlocks": s.deadlocks, "worker_warnings_and_errors": len(s.problems),
                     "first_worker_problems": s.problems[:5], "worker_exit_codes": sorted(set(s.exits), key=str),
                     "load_average_per_sample": s.loads, "locks": s.locks.to_dict()},
        ))
    return results

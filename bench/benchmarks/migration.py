"""The queue-stage migration (0003) on a large pre-upgrade database, against a bare UPDATE.

Data: ``--scale`` x 100,000 finished runs of 20 ten-step flows (1,000,000 task rows), loaded in
bulk into a baseline (schema 0002) database, vacuumed and analysed, then used as a template; every
sample runs on a fresh copy.

Timed, per sample:

* **baseline**: ``UPDATE pgflow.step_tasks SET error_message = lower(flow_slug)`` in one
  transaction: a bare update of one column of every task row (the work a naive backfill does);
* **measured**: ``pgflow_cli.installer.apply`` of migration 0003 with ``online="auto"`` (the
  phased path above 100,000 task rows), from the first statement to the ledger row.

While each runs, a prober on its own connection repeats what a worker does every 20 ms: a read of
a task row by key, and the row lock a claim takes on it (``SELECT ... FOR UPDATE``, which waits for
any transaction holding the row or a conflicting table lock, without writing), for one row at each
end of the heap (a bulk update locks the first early and the last late). The longest single probe
is the longest time a lock blocked workers' reads or claims. Goals (issue "pgflow migrate and
Stage 1"): longest blocking wait under 1 s, total within 2x of the bare update.
The apply runs every migration after the baseline; the same probes are also kept for the time
0003's last phase runs alone ("during main": every table locked exclusively while the other tables'
columns, every function and the grants are written; it scans no task row).

This benchmark is heavy: it takes at most 2 samples per quantity whatever ``--repeat`` says.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

from bench.core import Context, Result
from pgflow_cli import installer

STEPS = 10
FLOWS = 20


def _load(conninfo: str, runs: int) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for f in range(FLOWS):
            conn.execute("SELECT pgflow.create_flow(%s)", (f"flow{f}",))
            for s in range(STEPS):
                conn.execute("SELECT pgflow.add_step(%s, %s, %s::text[])",
                             (f"flow{f}", f"step{s}", [f"step{s - 1}"] if s else []))
        conn.execute("SET session_replication_role = replica")  # bulk load: skip foreign-key triggers
        conn.execute(
            """
            INSERT INTO pgflow.runs (run_id, flow_slug, status, input, remaining_steps, started_at, completed_at)
            SELECT gen_random_uuid(), 'flow' || (i %% %(flows)s), 'completed', '{}', 0,
                   now() - interval '2 days', now() - interval '1 day'
            FROM generate_series(1, %(runs)s) AS i
            """, {"runs": runs, "flows": FLOWS})
        conn.execute(
            """
            INSERT INTO pgflow.step_states (flow_slug, run_id, step_slug, status, remaining_tasks, initial_tasks,
                                            created_at, started_at, completed_at)
            SELECT r.flow_slug, r.run_id, 'step' || s, 'completed', 0, 1,
                   r.started_at, r.started_at, r.completed_at
            FROM pgflow.runs AS r, generate_series(0, %(steps)s - 1) AS s
            """, {"steps": STEPS})
        conn.execute(
            """
            INSERT INTO pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, message_id, status, attempts_count,
                                           queued_at, started_at, completed_at)
            SELECT ss.flow_slug, ss.run_id, ss.step_slug, 0, row_number() OVER (), 'completed', 1,
                   ss.started_at, ss.started_at, ss.completed_at
            FROM pgflow.step_states AS ss
            """)
        conn.execute("SET session_replication_role = origin")
        conn.execute("VACUUM ANALYZE")


class Prober:
    """Times a worker-like read and claim every ``interval`` seconds; keeps the longest of each."""

    def __init__(self, conninfo: str, keys: list[tuple], interval: float = 0.02) -> None:
        self.conninfo = conninfo
        self.keys = keys
        self.interval = interval
        self.longest = {"read": 0.0, "claim": 0.0}
        self.window = {"read": 0.0, "claim": 0.0}
        """Like ``longest``, since the last :meth:`reset_window` (one migration's share)."""
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.conninfo, autocommit=True, application_name="bench prober") as conn:
            while not self._stop.is_set():
                for key in self.keys:
                    for kind, query in (
                        ("read", "SELECT status FROM pgflow.step_tasks WHERE run_id = %s AND step_slug = %s AND task_index = 0"),
                        ("claim", "SELECT status FROM pgflow.step_tasks "
                                  "WHERE run_id = %s AND step_slug = %s AND task_index = 0 FOR UPDATE"),
                    ):
                        started = time.perf_counter()
                        conn.execute(query, key)
                        waited = time.perf_counter() - started
                        self.longest[kind] = max(self.longest[kind], waited)
                        self.window[kind] = max(self.window[kind], waited)
                self.count += 1
                self._stop.wait(self.interval)

    def reset_window(self) -> None:
        self.window = {"read": 0.0, "claim": 0.0}

    @contextmanager
    def running(self, settle: float = 0.2) -> Iterator[Prober]:
        """Probe in a thread for the duration of the block: ``settle`` seconds of probes before
        the block and after it, so a wait at either edge of the timed work is seen."""
        self._thread.start()
        try:
            time.sleep(settle)
            yield self
            time.sleep(settle)
        finally:
            self._stop.set()
            self._thread.join(60)


BARE_UPDATE = "UPDATE pgflow.step_tasks SET error_message = lower(flow_slug)"
"""The baseline of both upgrade benchmarks (this one and adoption): one statement rewriting every task row."""


@contextmanager
def database_copy(ctx: Context, admin: psycopg.Connection, source: str, name: str) -> Iterator[str]:
    """A database ``name`` created from the template ``source`` for one sample (its conninfo),
    dropped afterwards whatever happens; ``admin`` is an autocommit connection to another database."""
    admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(source)))
    try:
        yield ctx.conninfo(name)
    finally:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def run(ctx: Context) -> list[Result]:
    runs = ctx.size(100_000, minimum=1_000)
    samples = min(ctx.repeat, 2)
    results = {
        "bare": Result("bare UPDATE of one column", "s", [], work=runs * STEPS,
                       details={"statement": "UPDATE pgflow.step_tasks SET error_message = lower(flow_slug)"}),
        "migration": Result("migration 0003 total", "s", [], work=runs * STEPS, baseline="bare UPDATE of one column"),
        "bare_claim": Result("longest claim wait, bare UPDATE", "s", [], work=runs * STEPS),
        "claim": Result("longest claim wait, migration 0003", "s", [], work=runs * STEPS,
                        baseline="longest claim wait, bare UPDATE"),
        "read": Result("longest read wait, migration 0003", "s", [], work=runs * STEPS),
        # the same probes, only while 0003's last phase runs: its share of the waits
        "claim_main": Result("longest claim wait, during 0003 main", "s", [], work=runs * STEPS),
        "read_main": Result("longest read wait, during 0003 main", "s", [], work=runs * STEPS),
    }
    with ctx.database("mig_data", schema=installer.BASELINE_VERSION) as loaded:
        ctx.log(f"loading {runs} runs / {runs * STEPS} task rows into a baseline database")
        started = time.perf_counter()
        _load(loaded, runs)
        ctx.log(f"loaded in {time.perf_counter() - started:.0f}s")
        source = psycopg.conninfo.conninfo_to_dict(loaded)["dbname"]
        with psycopg.connect(loaded) as conn:
            keys = [conn.execute(f"SELECT run_id, step_slug FROM pgflow.step_tasks ORDER BY ctid {order} LIMIT 1").fetchone()
                    for order in ("ASC", "DESC")]
        admin = psycopg.connect(ctx.conninfo("postgres"), autocommit=True)
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (source,))
        try:
            for sample in range(samples):
                for kind in ("bare", "migration"):
                    with database_copy(ctx, admin, source, f"mig_{kind}_{sample}") as conninfo:
                        with psycopg.connect(conninfo, autocommit=True) as conn, Prober(conninfo, keys).running() as prober:
                            started = time.perf_counter()
                            if kind == "bare":
                                conn.execute(BARE_UPDATE)
                                path = "one statement"
                            else:
                                during_main: dict[str, float] = {"claim": 0.0, "read": 0.0}

                                def window(event: str, data: dict, prober: Prober = prober,
                                           during: dict[str, float] = during_main) -> None:
                                    if data.get("phase", "main") != "main":
                                        return
                                    if event in ("phase", "start"):
                                        prober.reset_window()
                                    elif event in ("phase_done", "done"):
                                        during.update({k: max(during[k], v) for k, v in prober.window.items()})

                                applied = installer.apply(conn, online="auto", progress=window)
                                path = "phased" if applied and applied[-1].online else "one transaction"
                            seconds = time.perf_counter() - started
                        if kind == "bare":
                            results["bare"].samples.append(seconds)
                            results["bare_claim"].samples.append(prober.longest["claim"])
                        else:
                            results["migration"].samples.append(seconds)
                            results["migration"].details["path"] = path
                            results["claim"].samples.append(prober.longest["claim"])
                            results["read"].samples.append(prober.longest["read"])
                            results["claim_main"].samples.append(during_main["claim"])
                            results["read_main"].samples.append(during_main["read"])
                        ctx.log(f"sample {sample + 1}/{samples} {kind}: {seconds:.1f}s total, longest claim wait "
                                f"{prober.longest['claim']:.3f}s, read {prober.longest['read']:.3f}s ({prober.count} probes)")
        finally:
            admin.close()
    return list(results.values())

"""Adopting a large database installed by pgflow 0.8.1, then the queue-identity upgrade, against a bare UPDATE.

Data: ``--scale`` x 100,000 finished runs of 20 ten-step flows (1,000,000 step_states and
1,000,000 task rows, every task with an output), loaded in bulk into a database built by the
published ``@pgflow/core`` 0.8.1 migrations (tests/support/published.py; the hand-written 0.8.1
shape of tests/support/upstream_shapes.py when the release cannot be built here), vacuumed and
analysed, then used as a template; every sample runs on a fresh copy.

Timed, per sample:

* **baseline**: ``UPDATE pgflow.step_tasks SET error_message = lower(flow_slug)`` in one
  transaction (the bare update of the migration benchmark);
* **measured**: what ``pgflow migrate apply`` does on such a database, in its order: recognition,
  :func:`pgflow_cli.upstream.adopt.adopt` (``online="auto"``: the adoption transaction, then the
  concurrent index and the constraint validations), ``pgflow_cli.installer.apply`` of the
  migrations after the baseline (0003's phased path ...) up to the last ledger row: **upgrade**,
  the time workers wait for (they are stopped for it); then the history backfill of the finished
  runs' step outputs (:func:`pgflow_cli.upstream.adopt.complete`, batches, workers running):
  **history**; and the two together: **total**.

The prober of the migration benchmark runs meanwhile (a worker's read and claim of a task row at
each end of the heap, every 20 ms); its longest single wait is the longest time a lock blocked
workers. Goals (issue 8): longest blocking wait under 1 s, adopting + upgrading within 2x of the
bare update (the upgrade; the total with the history is reported beside it). The adoption
transaction alone is reported too. At most 3 samples per quantity.
"""

from __future__ import annotations

import time

import psycopg
from psycopg import sql

from bench.benchmarks.migration import BARE_UPDATE, Prober, database_copy
from bench.core import Context, Result
from pgflow_cli import installer
from pgflow_cli.installer.events import Event, PhaseDone, PhaseStarted, StepDone, StepStarted
from pgflow_cli.upstream import adopt as adoption
from pgflow_cli.upstream import recognise as rec
from tests.support import upstream_shapes

STEPS = upstream_shapes.LOAD_STEPS


def _build_release(ctx: Context, conninfo: str) -> str:
    from tests.support import published

    with psycopg.connect(ctx.conninfo("postgres"), autocommit=True) as admin:
        try:
            published.build_schema(conninfo, admin)
            return f"published @pgflow/core {published.RELEASE}"
        except published.PublishedReleaseError as exc:
            ctx.log(f"cannot build the published release ({exc}); using the hand-written 0.8.1 shape")
    upstream_shapes.build(conninfo, "0.8.1")
    return "hand-written 0.8.1 shape"


def run(ctx: Context) -> list[Result]:
    runs = ctx.size(100_000, minimum=1_000)
    samples = min(ctx.repeat, 3)
    work = runs * STEPS
    results = {
        "bare": Result("bare UPDATE of one column", "s", [], work=work,
                       details={"statement": "UPDATE pgflow.step_tasks SET error_message = lower(flow_slug)"}),
        "upgrade": Result("adopt 0.8.1 + migrations, until committed", "s", [], work=work,
                          baseline="bare UPDATE of one column"),
        "history": Result("history backfill of finished runs, after them", "s", [], work=work,
                          baseline="bare UPDATE of one column"),
        "total": Result("adopt 0.8.1 + migrations + history backfill", "s", [], work=work,
                        baseline="bare UPDATE of one column"),
        "adopt": Result("adoption transaction", "s", [], work=work),
        "bare_claim": Result("longest claim wait, bare UPDATE", "s", [], work=work),
        "claim": Result("longest claim wait, adopt + migrations + history", "s", [], work=work,
                        baseline="longest claim wait, bare UPDATE"),
        "read": Result("longest read wait, adopt + migrations + history", "s", [], work=work),
        "upgrade_claim": Result("longest claim wait, adopt + migrations, until committed", "s", [], work=work),
        "upgrade_read": Result("longest read wait, adopt + migrations, until committed", "s", [], work=work),
        # each phase's share of the probes (window reset at every start/phase event): which one blocks
        "phase_wait": Result("longest wait of any one phase (claim or read)", "s", [], work=work),
    }
    admin = psycopg.connect(ctx.conninfo("postgres"), autocommit=True)
    source = "bench_adopt_data"
    admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(source)))
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(source)))
    try:
        loaded = ctx.conninfo(source)
        built = _build_release(ctx, loaded)
        ctx.log(f"loading {runs} runs / {work} task rows into a {built} database")
        started = time.perf_counter()
        upstream_shapes.load_finished_runs(loaded, runs)
        ctx.log(f"loaded in {time.perf_counter() - started:.0f}s")
        with psycopg.connect(loaded) as conn:
            keys = [conn.execute(f"SELECT run_id, step_slug FROM pgflow.step_tasks ORDER BY ctid {order} LIMIT 1").fetchone()
                    for order in ("ASC", "DESC")]
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (source,))
        for name in ("bare", "upgrade", "total"):
            results[name].details["database"] = built
        for sample in range(samples):
            for kind in ("bare", "total"):
                with database_copy(ctx, admin, source, f"adopt_{kind}_{sample}") as conninfo:
                    with psycopg.connect(conninfo, autocommit=True) as conn, Prober(conninfo, keys).running() as prober:
                        started = time.perf_counter()
                        if kind == "bare":
                            conn.execute(BARE_UPDATE)
                        else:
                            phases: dict[str, float] = {}
                            waits: dict[str, list[float]] = {}
                            mark = [time.perf_counter()]

                            def progress(event: Event, phases: dict = phases, mark: list = mark,
                                         waits: dict = waits, prober: Prober = prober) -> None:
                                if isinstance(event, (StepStarted, PhaseStarted)):
                                    prober.reset_window()
                                if isinstance(event, (PhaseDone, StepDone)):
                                    key = f"{event.step} {getattr(event, 'phase', 'transaction')}"
                                    now = time.perf_counter()
                                    phases[key] = round(phases.get(key, 0) + now - mark[0], 2)
                                    mark[0] = now
                                    # the longest claim and read wait while this phase ran (its share)
                                    seen = waits.setdefault(key, [0.0, 0.0])
                                    seen[:] = [round(max(seen[0], prober.window["claim"]), 3),
                                               round(max(seen[1], prober.window["read"]), 3)]
                                    prober.reset_window()

                            found = rec.recognise(conn)
                            adopted = adoption.adopt(conn, found, online="auto", progress=progress)
                            applied = installer.apply(conn, online="auto", progress=progress)
                            upgraded = time.perf_counter() - started
                            upgrade_waits = dict(prober.longest)
                            adoption.complete(conn, history=True, progress=progress)
                        seconds = time.perf_counter() - started
                    if kind == "bare":
                        results["bare"].samples.append(seconds)
                        results["bare_claim"].samples.append(prober.longest["claim"])
                    else:
                        _check(conninfo, runs)
                        results["upgrade"].samples.append(upgraded)
                        results["history"].samples.append(seconds - upgraded)
                        results["total"].samples.append(seconds)
                        results["total"].details.update(
                            phases_s=phases, release=found.label, adoption_online=adopted.online,
                            migration_path="phased" if applied and applied[-1].online else "one transaction")
                        results["adopt"].samples.append(adopted.duration_ms / 1000)
                        results["claim"].samples.append(prober.longest["claim"])
                        results["read"].samples.append(prober.longest["read"])
                        results["upgrade_claim"].samples.append(upgrade_waits["claim"])
                        results["upgrade_read"].samples.append(upgrade_waits["read"])
                        worst = max(waits, key=lambda k: max(waits[k]))
                        results["phase_wait"].samples.append(max(waits[worst]))
                        results["phase_wait"].details.setdefault("worst_phase", []).append(worst)
                        results["total"].details.setdefault("waits_s", []).append(waits)
                    if kind == "total":
                        ctx.log(f"  seconds per phase: {phases}; upgrade committed after {upgraded:.1f}s")
                        ctx.log(f"  longest [claim, read] wait per phase, s: {waits}")
                    ctx.log(f"sample {sample + 1}/{samples} {kind}: {seconds:.1f}s total, longest claim wait "
                            f"{prober.longest['claim']:.3f}s, read {prober.longest['read']:.3f}s ({prober.count} probes)")
    finally:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(source)))
        admin.close()
    return list(results.values())


def _check(conninfo: str, runs: int) -> None:
    """The measured run did all the work: every step output backfilled, 0003 applied, rows kept."""
    with psycopg.connect(conninfo) as conn:
        missing = conn.execute("SELECT count(*) FROM pgflow.step_states WHERE output IS NULL").fetchone()[0]
        tasks = conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE queue_name IS NOT NULL").fetchone()[0]
        protocol = conn.execute("SELECT pgflow.protocol_version()").fetchone()[0]
    if missing or tasks != runs * STEPS or protocol != 2:
        raise RuntimeError(f"adoption benchmark did not finish its work: {missing} outputs missing, "
                           f"{tasks} tasks with a queue, protocol {protocol}")

"""The step-state lines of ``pgflow drop-flow --export``: the export statement against a bare read of
the same rows.

Data (``--scale`` x): the ``drop_flow`` benchmark's flow ``retired`` (20,000 started runs, five
steps each, two of them completed: 100,000 step states), loaded in bulk and analysed. Timed, per
sample, the statement run as the export runs it (``export_step_states`` of
``sql/queries/drop_flow.sql`` through a named cursor, 2,000 rows per fetch, every line read), in
a transaction of its own. **Lower is better.**

* **baseline**: ``SELECT to_jsonb(ss)::text ... ORDER BY run_id, step_slug`` of the flow's step
  states, the statement the export had before it took outputs from ``get_run_with_states``;
* **nothing pending**: the export statement on those rows (every completed step has its output),
  samples interleaved with the baseline's;
* **every run pending**: the same after setting the completed steps' outputs to NULL (runs that
  finished before an adoption of pgflow 0.8-0.12, before the history backfill): every run's lines
  then come from one ``pgflow.get_run_with_states`` call; against the bare read of those rows,
  interleaved again.
"""

from __future__ import annotations

import time

import psycopg

from bench.benchmarks.drop_flow import STEPS, _load
from bench.core import Context, Result
from pgflow_cli import sqlfiles

BARE_SQL = """SELECT pg_catalog.to_jsonb(ss)::text AS line FROM pgflow.step_states AS ss
WHERE ss.flow_slug = %(flow_slug)s ORDER BY ss.run_id, ss.step_slug"""
PENDING_SQL = "UPDATE pgflow.step_states SET output = NULL WHERE flow_slug = 'retired' AND status = 'completed'"


def _read_all(conn: psycopg.Connection, statement: str) -> float:
    """Seconds to run ``statement`` through a named cursor and read every line (as the export does)."""
    started = time.perf_counter()
    with conn.transaction(), conn.cursor(name="export_bench") as cur:
        cur.itersize = 2000
        cur.execute(statement, {"flow_slug": "retired"})
        for (_line,) in cur:
            pass
    return time.perf_counter() - started


def run(ctx: Context) -> list[Result]:
    runs = ctx.size(20_000, minimum=1_000)
    export = sqlfiles.statement("queries/drop_flow.sql", "export_step_states")
    details = {"runs": runs, "step_states": runs * STEPS, "lower_is_better": True}
    work = runs * STEPS
    bare = Result("bare read of the step-state rows", "s", [], work=work, details={**details, "statement": BARE_SQL})
    none = Result("export, nothing pending", "s", [], work=work, baseline=bare.name, details=details)
    bare_null = Result("bare read, outputs NULL", "s", [], work=work, details={**details, "statement": BARE_SQL})
    every = Result("export, every run pending", "s", [], work=work, baseline=bare_null.name, details=details)
    with ctx.database("drop_export") as conninfo:
        _load(conninfo, runs)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            for phase, (baseline, measured) in enumerate(((bare, none), (bare_null, every))):
                if phase:
                    conn.execute(PENDING_SQL)
                    conn.execute("VACUUM ANALYZE pgflow.step_states")
                for statement in (BARE_SQL, export):  # warm the cache, not timed
                    _read_all(conn, statement)
                for sample in range(ctx.repeat):
                    baseline.samples.append(_read_all(conn, BARE_SQL))
                    measured.samples.append(_read_all(conn, export))
                    ctx.log(f"sample {sample + 1}/{ctx.repeat}: {baseline.name} {baseline.samples[-1]:.2f}s, "
                            f"{measured.name} {measured.samples[-1]:.2f}s")
    return [bare, none, bare_null, every]

"""``pgflow audit``: the time of the audit's SQL for 10,000 flows against 1,000 flows, and against a
bare scan of the same catalogs and tables (issue 18).

Data (``--scale`` x), built once per size in its own database (not timed): N flows
``flow_<i>`` made with ``pgflow.create_flow`` / ``pgflow.add_step`` (so N PGMQ queues, 2N queue
tables), each with three steps in a line; per flow one started run (``pgflow.start_flow``: one
queued task, its message in the queue table) and ``HISTORY`` completed runs loaded in bulk (their
step states and completed tasks, one archived message per task in the flow's archive table).
Then ``VACUUM ANALYZE``. N is 1,000 and 10,000; both are past the audit's lock budget
(4 x ``max_locks_per_transaction`` queue tables), so both take the estimated-backlog path, as
every large installation does.

Timed, per sample, from the first statement to the last row (in-process, one connection that
has already run the audit once, so the catalog caches are warm; no CLI start-up, no Python
report building):

* **audit**: what :func:`pgflow_cli.operations.audit.run_audit` sends inside its transaction:
  ``BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY``, the ``session_settings``, ``schema_probe``,
  ``findings`` and ``flow_impact`` statements of ``sql/audit.sql`` (every row fetched), the
  catalog query of the upstream recognition, ``ROLLBACK``;
* **bare scan** (the baseline), the same transaction frame and settings around one statement
  that reads, without computing anything, every row the audit reads: ``count(*)`` of
  ``pgflow.flows``, ``pgflow.steps``, ``pgflow.runs``, ``pgflow.step_tasks`` and ``pgmq.meta``;
  of the ``pg_class`` rows in the schemas ``pgflow`` and ``pgmq`` (tables, indexes, sequences);
  of the ``pg_index`` rows of their tables; of the ``pg_attribute`` rows of those relations; of the ``pg_depend`` rows that tie a
  ``pgmq`` sequence to its table; and of the ``pg_proc`` rows in the two schemas. It reads no
  queue table, no archive table and no sequence (neither does the audit past its lock budget;
  it reads a queue's sequence only for a flow whose legacy queue lives elsewhere, none here); the
  audit also reads the ``pg_class`` rows of the
  archive tables' TOAST tables and their indexes (archive size estimates), the bare scan does not.

Reported in milliseconds (**lower is better**): the audit at 1,000 and 10,000 flows, each bare
scan, and the ratios: audit 10k / audit 1k (goal <= 11x: linear in the number of flows) and
audit / bare scan at 10k (goal <= 6x). Samples interleave bare scan and audit, ``ctx.repeat``
times each (at least 3). Checked before timing: the audit reports N flows, N x 3 steps, no
finding, and every flow's backlog and archive estimates. Setup dominates the run time (creating
10,000 queues: about 2 minutes on an idle 2-core machine); ``--scale`` shrinks both sizes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
from psycopg import sql

from bench.core import Context, Result
from pgflow_cli import sqlfiles
from pgflow_cli.db import transaction
from pgflow_cli.operations import audit as audit_op
from pgflow_cli.upstream import recognise

SIZES = (1_000, 10_000)
HISTORY = 4
"""Completed runs per flow (3 completed tasks and 3 archived messages each)."""
BATCH = 250
"""Flows created per transaction (each pgmq.create takes a few locks until commit)."""

BARE_SCAN_SQL = """
WITH ns AS (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname IN ('pgflow', 'pgmq'))
SELECT (SELECT count(*) FROM pgflow.flows) AS flows,
       (SELECT count(*) FROM pgflow.steps) AS steps,
       (SELECT count(*) FROM pgflow.runs) AS runs,
       (SELECT count(*) FROM pgflow.step_tasks) AS step_tasks,
       (SELECT count(*) FROM pgmq.meta) AS meta,
       (SELECT count(*) FROM pg_catalog.pg_class AS c WHERE c.relnamespace IN (SELECT oid FROM ns)) AS relations,
       (SELECT count(*) FROM pg_catalog.pg_index AS x
          JOIN pg_catalog.pg_class AS c ON c.oid = x.indrelid
         WHERE c.relnamespace IN (SELECT oid FROM ns)) AS indexes,
       (SELECT count(*) FROM pg_catalog.pg_attribute AS a
          JOIN pg_catalog.pg_class AS c ON c.oid = a.attrelid
         WHERE c.relnamespace IN (SELECT oid FROM ns) AND a.attnum > 0) AS attributes,
       (SELECT count(*) FROM pg_catalog.pg_depend AS d
          JOIN pg_catalog.pg_class AS s ON s.oid = d.objid AND s.relkind = 'S'
         WHERE d.classid = 'pg_catalog.pg_class'::regclass AND s.relnamespace IN (SELECT oid FROM ns)) AS sequence_links,
       (SELECT count(*) FROM pg_catalog.pg_proc AS p WHERE p.pronamespace IN (SELECT oid FROM ns)) AS functions
"""
"""The baseline: every row the audit reads, counted (see the module docstring)."""

ARCHIVE_SQL = """
DO $load$
DECLARE f text;
BEGIN
  FOR f IN SELECT 'flow_' || g FROM generate_series({first}, {last}) AS g LOOP
    EXECUTE format('INSERT INTO pgmq.%I (msg_id, read_ct, enqueued_at, archived_at, vt, message) '
                   'SELECT t.message_id, 1, t.queued_at, t.completed_at, t.queued_at, '
                   '       jsonb_build_object(''run_id'', t.run_id, ''step_slug'', t.step_slug) '
                   'FROM pgflow.step_tasks AS t WHERE t.flow_slug = $1 AND t.status = ''completed''',
                   'a_' || f) USING f;
  END LOOP;
END
$load$
"""
"""One archived message per completed task of flows ``{first}`` to ``{last}`` (setup, not timed)."""


def _load(conninfo: str, flows: int, log: Callable[[str], None]) -> None:
    """N flows with three steps, one started run each and ``HISTORY`` completed runs (not timed)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SET client_min_messages = warning")
        started = time.perf_counter()
        for first in range(1, flows + 1, BATCH):
            last = min(flows, first + BATCH - 1)
            with conn.transaction():
                conn.execute(
                    """
                    SELECT pgflow.create_flow('flow_' || g),
                           pgflow.add_step('flow_' || g, 'first'),
                           pgflow.add_step('flow_' || g, 'second', ARRAY['first']),
                           pgflow.add_step('flow_' || g, 'third', ARRAY['second'])
                    FROM generate_series(%s::integer, %s::integer) AS g
                    """, (first, last))
                conn.execute("SELECT count(*) FROM generate_series(%s::integer, %s::integer) AS g "
                             "CROSS JOIN LATERAL pgflow.start_flow('flow_' || g, '{}'::jsonb)", (first, last))
        log(f"{flows} flows created and started in {time.perf_counter() - started:.0f}s")
        conn.execute("SET session_replication_role = replica")  # bulk history: skip foreign-key triggers
        conn.execute(
            """
            INSERT INTO pgflow.runs (run_id, flow_slug, status, input, output, remaining_steps, started_at, completed_at)
            SELECT gen_random_uuid(), f.flow_slug, 'completed', '{}', '{}', 0, now() - interval '1 day', now()
            FROM pgflow.flows AS f CROSS JOIN generate_series(1, %s)
            """, (HISTORY,))
        conn.execute(
            """
            INSERT INTO pgflow.step_states (flow_slug, run_id, step_slug, status, remaining_tasks, initial_tasks,
                                            created_at, started_at, completed_at, output)
            SELECT r.flow_slug, r.run_id, s.step_slug, 'completed', 0, 1, r.started_at, r.started_at,
                   r.completed_at, '"ok"'::jsonb
            FROM pgflow.runs AS r JOIN pgflow.steps AS s ON s.flow_slug = r.flow_slug
            WHERE r.status = 'completed'
            """)
        conn.execute(
            """
            INSERT INTO pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id, status,
                                           attempts_count, queued_at, started_at, completed_at, output)
            SELECT ss.flow_slug, ss.run_id, ss.step_slug, 0, lower(ss.flow_slug),
                   1000 + row_number() OVER (PARTITION BY ss.flow_slug ORDER BY ss.run_id, ss.step_slug),
                   'completed', 1, ss.started_at, ss.started_at, ss.completed_at, ss.output
            FROM pgflow.step_states AS ss WHERE ss.status = 'completed'
            """)
        conn.execute("SET session_replication_role = origin")
        for first in range(1, flows + 1, BATCH):
            last = min(flows, first + BATCH - 1)
            with conn.transaction():
                conn.execute(sql.SQL(ARCHIVE_SQL).format(first=first, last=last))
        started = time.perf_counter()
        conn.execute("VACUUM ANALYZE")
        log(f"VACUUM ANALYZE in {time.perf_counter() - started:.0f}s")


def _in_audit_transaction(conn: psycopg.Connection, body: Callable[[psycopg.Cursor], int]) -> int:
    """``body`` inside the audit's transaction frame and settings; returns what it returns."""
    with transaction(conn, read_only=True, isolation="repeatable read", statement_timeout=None,
                              lock_timeout=5.0):
        with conn.cursor() as cur:
            cur.execute(sqlfiles.statement(audit_op.AUDIT_SQL, "session_settings"))
            return body(cur)


def _audit_sql(conn: psycopg.Connection) -> int:
    """The audit's statements (every row fetched); returns the number of flow rows."""
    def body(cur: psycopg.Cursor) -> int:
        cur.execute(sqlfiles.statement(audit_op.AUDIT_SQL, "schema_probe"))
        cur.fetchall()
        recognise.recognise(conn)
        cur.execute(sqlfiles.statement(audit_op.AUDIT_SQL, "findings"))
        cur.fetchall()
        cur.execute(sqlfiles.statement(audit_op.AUDIT_SQL, "flow_impact"))
        return len(cur.fetchall())
    return _in_audit_transaction(conn, body)


def _bare_scan(conn: psycopg.Connection) -> int:
    def body(cur: psycopg.Cursor) -> int:
        cur.execute(BARE_SCAN_SQL)
        row = cur.fetchone()
        assert row is not None
        return int(row[0])
    return _in_audit_transaction(conn, body)


def _check(conn: psycopg.Connection, flows: int) -> None:
    """The audit saw the whole dataset and found nothing (outside the timed part)."""
    report = audit_op.run_audit(conn)
    assert len(report.flows) == flows, len(report.flows)
    assert not report.findings, report.findings[:3]
    assert all(f.steps == 3 and f.total_runs == HISTORY + 1 and f.queued_tasks == 1 for f in report.flows)
    assert all(f.archive_rows_estimate == 3 * HISTORY and f.archive_bytes for f in report.flows)
    assert all(f.queue_backlog is not None and not f.backlog_exact for f in report.flows)


def run(ctx: Context) -> list[Result]:
    samples = max(ctx.repeat, 3)
    sizes = [ctx.size(n, minimum=300) for n in SIZES]
    results: list[Result] = []
    audits: dict[int, Result] = {}
    for flows in sizes:
        bare = Result(f"bare scan, {flows} flows", "ms", [], work=flows,
                      details={"statement": BARE_SCAN_SQL.strip(), "lower_is_better": True})
        measured = Result(f"audit SQL, {flows} flows", "ms", [], work=flows, baseline=bare.name,
                          details={"statements": ["session_settings", "schema_probe", "recognise", "findings",
                                                  "flow_impact"], "history_runs_per_flow": HISTORY,
                                   "steps_per_flow": 3, "lower_is_better": True})
        with ctx.database(f"audit_{flows}") as conninfo:
            ctx.log(f"loading {flows} flows")
            _load(conninfo, flows, ctx.log)
            with psycopg.connect(conninfo, autocommit=True) as conn:
                _check(conn, flows)  # also warms this backend's catalog caches
                _bare_scan(conn)
                for sample in range(samples):
                    for result, fn in ((bare, _bare_scan), (measured, _audit_sql)):
                        started = time.perf_counter()
                        fn(conn)
                        result.samples.append(1000 * (time.perf_counter() - started))
                    ctx.log(f"{flows} flows, sample {sample + 1}/{samples}: bare {bare.samples[-1]:.0f} ms, "
                            f"audit {measured.samples[-1]:.0f} ms")
        results += [bare, measured]
        audits[flows] = measured
    small, large = (audits[n] for n in sizes)
    scaling = Result(f"audit SQL, {sizes[1]} flows, vs {sizes[0]}", "ms", list(large.samples), work=sizes[1],
                     baseline=small.name, details={"goal": "<= 11x", "lower_is_better": True})
    results.append(scaling)
    return results

"""Whole-flow deletion (``pgflow.drop_flow``) of a large flow, against plain DELETE statements that
archive the messages first.

Data (``--scale`` x): one flow ``retired`` with five root steps and 100,000 started runs, so
500,000 task rows and 500,000 step states: per run two tasks completed (their messages in the
archive: 200,000 archived messages) and three queued (their messages in the queue: 300,000). A
second flow ``bystander`` (10,000 runs, one step, completed) shares the tables and must be left
untouched. Loaded in bulk, vacuumed and analysed, then used as a template; every sample runs on
a fresh copy, the three variants interleaved.

Timed, per sample, one transaction each, from BEGIN to COMMIT:

* **baseline, per message** (what the spec rules out: "do not archive individual messages
  immediately before dropping both tables"): the flow's runs locked ``FOR UPDATE``; every live
  message archived with its own ``pgmq.archive(queue, msg_id)`` call (server side, one statement);
  then ``DELETE`` of the flow's tasks, step states, runs, archived messages
  (``DELETE FROM pgmq.a_retired``), dependencies, steps and flow; last ``pgmq.drop_queue`` of the
  now empty queue, so every variant ends in the same state;
* **baseline, batched**: the same, with one ``pgmq.archive(queue, ids[])`` call for all messages
  (the strongest plain-SQL variant);
* **measured**: ``SELECT pgflow.drop_flow('retired', force => true)`` (force: the runs are started).

After each sample the outcome is checked: no row of ``retired`` and no queue table left, every
``bystander`` row still there. Goal (issue 11): drop_flow at least 2x faster than archive-then-delete.
Most of every variant's time is PostgreSQL's per-row foreign-key checks when step states and runs
are deleted (step_tasks -> step_states -> runs); they are the same in all three. Heavy: at most 2
samples per quantity whatever ``--repeat`` says.
"""

from __future__ import annotations

import time

import psycopg
from psycopg import sql

from bench.core import Context, Result

STEPS = 5
DONE_PER_RUN = 2
BYSTANDER_RUNS = 10_000

LOCK_SQL = "SELECT count(*) FROM (SELECT 1 FROM pgflow.runs WHERE flow_slug = 'retired' ORDER BY run_id FOR UPDATE) AS l"
ARCHIVE_EACH_SQL = """SELECT count(*) FILTER (WHERE pgmq.archive('retired', message_id)) FROM pgflow.step_tasks
                      WHERE flow_slug = 'retired' AND status IN ('queued', 'started')"""
ARCHIVE_BATCH_SQL = """SELECT pgmq.archive('retired', ARRAY(SELECT message_id FROM pgflow.step_tasks
                                          WHERE flow_slug = 'retired' AND status IN ('queued', 'started')))"""
DELETE_SQL = [
    "DELETE FROM pgflow.step_tasks WHERE flow_slug = 'retired'",
    "DELETE FROM pgflow.step_states WHERE flow_slug = 'retired'",
    "DELETE FROM pgflow.runs WHERE flow_slug = 'retired'",
    "DELETE FROM pgmq.a_retired",
    "DELETE FROM pgflow.deps WHERE flow_slug = 'retired'",
    "DELETE FROM pgflow.steps WHERE flow_slug = 'retired'",
    "DELETE FROM pgflow.flows WHERE flow_slug = 'retired'",
    "SELECT pgmq.drop_queue('retired')",
]
VARIANTS = {
    "per_message": [LOCK_SQL, ARCHIVE_EACH_SQL, *DELETE_SQL],
    "batched": [LOCK_SQL, ARCHIVE_BATCH_SQL, *DELETE_SQL],
    "drop_flow": ["SELECT pgflow.drop_flow('retired', force => true)"],
}
"""Each variant, statement by statement (one transaction each)."""


def _load(conninfo: str, runs: int) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT pgflow.create_flow('retired')")
        for s in range(STEPS):
            conn.execute("SELECT pgflow.add_step('retired', %s)", (f"s{s}",))
        conn.execute("SELECT pgflow.create_flow('bystander'), pgflow.add_step('bystander', 'only')")
        conn.execute("SET session_replication_role = replica")  # bulk load: skip foreign-key triggers
        conn.execute("SET maintenance_work_mem = '256MB'")
        conn.execute(
            """
            INSERT INTO pgflow.runs (run_id, flow_slug, status, input, remaining_steps, started_at)
            SELECT gen_random_uuid(), 'retired', 'started', jsonb_build_object('i', i), %(left)s, now() - interval '1 hour'
            FROM generate_series(1, %(runs)s) AS i
            """, {"runs": runs, "left": STEPS - DONE_PER_RUN})
        conn.execute(
            """
            INSERT INTO pgflow.runs (run_id, flow_slug, status, input, output, remaining_steps, started_at, completed_at)
            SELECT gen_random_uuid(), 'bystander', 'completed', '{}', '{}', 0, now() - interval '1 hour', now()
            FROM generate_series(1, %(n)s)
            """, {"n": BYSTANDER_RUNS})
        conn.execute(
            """
            INSERT INTO pgflow.step_states (flow_slug, run_id, step_slug, status, remaining_tasks, initial_tasks,
                                            created_at, started_at, completed_at, output)
            SELECT r.flow_slug, r.run_id, s.slug,
                   CASE WHEN s.done THEN 'completed' ELSE 'started' END, CASE WHEN s.done THEN 0 ELSE 1 END, 1,
                   r.started_at, r.started_at, CASE WHEN s.done THEN r.started_at END, CASE WHEN s.done THEN '"ok"'::jsonb END
            FROM pgflow.runs AS r
            CROSS JOIN LATERAL (SELECT st.step_slug AS slug, st.step_index < %(done)s AS done
                                FROM pgflow.steps AS st WHERE st.flow_slug = r.flow_slug) AS s
            WHERE r.flow_slug = 'retired'
            UNION ALL
            SELECT r.flow_slug, r.run_id, 'only', 'completed', 0, 1, r.started_at, r.started_at, r.completed_at, '"ok"'::jsonb
            FROM pgflow.runs AS r WHERE r.flow_slug = 'bystander'
            """, {"done": DONE_PER_RUN})
        conn.execute(
            """
            INSERT INTO pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id, status,
                                           attempts_count, queued_at, started_at, completed_at, output)
            SELECT ss.flow_slug, ss.run_id, ss.step_slug, 0, lower(ss.flow_slug), row_number() OVER (PARTITION BY ss.flow_slug),
                   CASE WHEN ss.status = 'completed' THEN 'completed' ELSE 'queued' END,
                   CASE WHEN ss.status = 'completed' THEN 1 ELSE 0 END, ss.started_at,
                   CASE WHEN ss.status = 'completed' THEN ss.started_at END, ss.completed_at, ss.output
            FROM pgflow.step_states AS ss
            """)
        for queue in ("retired", "bystander"):
            for table, status in (("q", "queued"), ("a", "completed")):
                conn.execute(sql.SQL(
                    """
                    INSERT INTO pgmq.{} (msg_id, read_ct, enqueued_at, vt, message{})
                    {} SELECT t.message_id, 0, t.queued_at, now(),
                           jsonb_build_object('flow_slug', t.flow_slug, 'run_id', t.run_id, 'step_slug', t.step_slug, 'task_index', 0)
                           {}
                    FROM pgflow.step_tasks AS t WHERE t.queue_name = %(queue)s AND t.status = %(status)s
                    """).format(sql.Identifier(f"{table}_{queue}"), sql.SQL(", archived_at" if table == "a" else ""),
                                sql.SQL("OVERRIDING SYSTEM VALUE" if table == "q" else ""),
                                sql.SQL(", now()" if table == "a" else "")),
                    {"queue": queue, "status": status})
            conn.execute(sql.SQL("SELECT setval(pg_get_serial_sequence({}, 'msg_id'), (SELECT max(message_id) FROM "
                                 "pgflow.step_tasks WHERE queue_name = {}))").format(
                sql.Literal(f"pgmq.q_{queue}"), sql.Literal(queue)))
        conn.execute("SET session_replication_role = origin")
        conn.execute("VACUUM ANALYZE")


def _counts(conn: psycopg.Connection) -> dict[str, int]:
    row = conn.execute(
        """
        SELECT (SELECT count(*) FROM pgflow.step_tasks WHERE flow_slug = 'retired') AS tasks,
               (SELECT count(*) FROM pgflow.runs WHERE flow_slug = 'retired') AS runs,
               (SELECT count(*) FROM pgflow.step_tasks WHERE flow_slug = 'bystander') AS bystander_tasks,
               (SELECT count(*) FROM pgmq.a_bystander) AS bystander_archived,
               (to_regclass('pgmq.q_retired') IS NOT NULL OR to_regclass('pgmq.a_retired') IS NOT NULL)::int AS tables
        """).fetchone()
    return dict(zip(("tasks", "runs", "bystander_tasks", "bystander_archived", "tables"), row, strict=True))


def run(ctx: Context) -> list[Result]:
    runs = ctx.size(100_000, minimum=1_000)
    samples = min(ctx.repeat, 2)
    work = runs * STEPS
    details = {"runs": runs, "task_rows": work, "archived_messages": runs * DONE_PER_RUN,
               "queued_messages": runs * (STEPS - DONE_PER_RUN), "bystander_runs": BYSTANDER_RUNS}
    per_message = Result("archive each message, then DELETEs", "task rows/s", [], work=work,
                         details={**details, "statements": VARIANTS["per_message"]})
    batched = Result("archive all messages at once, then DELETEs", "task rows/s", [], work=work,
                     details={**details, "statements": VARIANTS["batched"]})
    measured = Result("pgflow.drop_flow", "task rows/s", [], work=work, baseline=per_message.name, details=details)
    also = Result("pgflow.drop_flow, same samples", "task rows/s", [], work=work, baseline=batched.name,
                  details={"note": "the drop_flow samples again, divided by the batched-archive baseline"})
    results = {"per_message": per_message, "batched": batched, "drop_flow": measured}
    with ctx.database("drop_data") as loaded:
        ctx.log(f"loading {runs} runs / {work} task rows / {runs * STEPS} step states and their messages")
        started = time.perf_counter()
        _load(loaded, runs)
        ctx.log(f"loaded in {time.perf_counter() - started:.0f}s")
        source = psycopg.conninfo.conninfo_to_dict(loaded)["dbname"]
        with psycopg.connect(loaded, autocommit=True) as conn:
            before = _counts(conn)
        assert before["tasks"] == work and before["tables"] == 1, before
        admin = psycopg.connect(ctx.conninfo("postgres"), autocommit=True)
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (source,))
        try:
            for sample in range(samples):
                for kind, result in results.items():
                    copy = f"drop_{kind}_{sample}"
                    admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(copy), sql.Identifier(source)))
                    try:
                        with psycopg.connect(ctx.conninfo(copy), autocommit=True) as conn:
                            conn.execute("SELECT count(*) FROM pgflow.step_tasks")  # warm the catalog, not timed
                            started = time.perf_counter()
                            with conn.transaction():
                                for statement in VARIANTS[kind]:
                                    conn.execute(statement)
                            seconds = time.perf_counter() - started
                            after = _counts(conn)
                        expected = {"tasks": 0, "runs": 0, "tables": 0, "bystander_tasks": before["bystander_tasks"],
                                    "bystander_archived": before["bystander_archived"]}
                        assert after == expected, (kind, after)
                        result.samples.append(seconds)
                        ctx.log(f"sample {sample + 1}/{samples} {kind}: {seconds:.2f}s")
                    finally:
                        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(copy)))
        finally:
            admin.close()
    # the table shows higher-is-better rates: task rows deleted per second; seconds kept in details
    for result in results.values():
        result.details["seconds"] = [round(s, 3) for s in result.samples]
        result.samples = [work / s for s in result.samples]
    also.samples = list(measured.samples)
    return [per_message, batched, measured, also]

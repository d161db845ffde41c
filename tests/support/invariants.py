"""Runtime invariants of the pgflow tables and their PGMQ queues, checked after every runtime test.

:func:`check_runtime_invariants` reads the whole database (no writes) and returns one line
per violation, so a failing test names every broken rule at once. :func:`assert_runtime_invariants`
raises ``AssertionError`` with those lines.

The rules (docs/runtime.md, "Invariants"):

1. truthful terminal state (upstream #638/#645): no step_tasks row is ``queued`` or
   ``started`` while its run is ``completed``/``failed`` or its step state is
   ``completed``/``failed``/``skipped``;
2. no message stays in a queue (visible or not) for a task that is finished: a task in a
   terminal status (completed, failed, skipped, cancelled), a task under a terminal run or step,
   or a permanently stalled task;
3. every live task (queued, or started and not permanently stalled) still has its message in
   its queue, and the message body names that task (flow, run, step, task index). Tests that
   remove a message on purpose turn this rule off with ``require_live_messages=False``;
4. bookkeeping: in a started run, a started step's ``remaining_tasks`` equals its number of
   queued/started tasks (a failed run keeps its other step states as they were, with their
   tasks cancelled); a started run's ``remaining_steps`` equals its number of created/started steps; a
   completed run has only completed or skipped steps; a failed run has at least one failed step.

5. manual tasks (``execution_mode = 'manual'``, the queue stage) have no queue, no message and
   are never ``queued``; rules 2 and 3 are about queue-backed tasks only.

A task's queue is its ``queue_name`` snapshot where the schema has one (queue identity,
migration 0003), else its ``flow_slug`` (the released baseline), read through
``to_jsonb(t) ->> 'queue_name'`` so one query serves both schema generations.
"""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

TERMINAL_TASK = ("completed", "failed", "skipped", "cancelled")
TERMINAL_RUN = ("completed", "failed")
TERMINAL_STEP = ("completed", "failed", "skipped")


def _queue_messages(cur: psycopg.Cursor, queue: str) -> list[dict] | None:
    """Messages still in ``queue`` (``None`` when the queue table does not exist)."""
    table = cur.execute("SELECT pgmq.format_table_name(%s, 'q') AS t", (queue,)).fetchone()["t"]
    exists = cur.execute("SELECT to_regclass(%s) IS NOT NULL AS e", (f"pgmq.{table}",)).fetchone()["e"]
    if not exists:
        return None
    return cur.execute(
        sql.SQL("SELECT msg_id, message FROM pgmq.{} ORDER BY msg_id").format(sql.Identifier(table))
    ).fetchall()


def check_runtime_invariants(conn: psycopg.Connection, *, require_live_messages: bool = True) -> list[str]:
    """Return a description of every invariant violation found (empty list: all good)."""
    problems: list[str] = []
    with conn.cursor(row_factory=dict_row) as cur:
        for row in cur.execute(
            """
            SELECT t.run_id, t.step_slug, t.task_index, t.status, r.status AS run_status, ss.status AS step_status
            FROM pgflow.step_tasks t
            JOIN pgflow.runs r ON r.run_id = t.run_id
            JOIN pgflow.step_states ss ON ss.run_id = t.run_id AND ss.step_slug = t.step_slug
            WHERE t.status IN ('queued', 'started')
              AND (r.status IN ('completed', 'failed') OR ss.status IN ('completed', 'failed', 'skipped'))
            """
        ).fetchall():
            problems.append(
                f"task {row['step_slug']}[{row['task_index']}] of run {row['run_id']} is {row['status']} "
                f"under run {row['run_status']} / step {row['step_status']}"
            )

        tasks = cur.execute(
            """
            SELECT t.flow_slug, coalesce(to_jsonb(t) ->> 'queue_name', t.flow_slug) AS queue,
                   t.run_id, t.step_slug, t.task_index, t.status, t.message_id,
                   t.permanently_stalled_at IS NOT NULL AS dead,
                   coalesce(to_jsonb(t) ->> 'execution_mode', 'queue') AS mode,
                   r.status AS run_status, ss.status AS step_status
            FROM pgflow.step_tasks t
            JOIN pgflow.runs r ON r.run_id = t.run_id
            JOIN pgflow.step_states ss ON ss.run_id = t.run_id AND ss.step_slug = t.step_slug
            """
        ).fetchall()
        for t in [t for t in tasks if t["mode"] == "manual"]:
            if t["message_id"] is not None or t["queue"] != t["flow_slug"] or t["status"] == "queued":
                problems.append(f"manual task {t['step_slug']}[{t['task_index']}] of run {t['run_id']} has a queue, "
                                f"a message or status queued ({t['queue']!r}, {t['message_id']}, {t['status']})")
        tasks = [t for t in tasks if t["mode"] != "manual"]
        queues = sorted({t["queue"] for t in tasks})
        messages: dict[str, dict[int, dict] | None] = {}
        for queue in queues:
            found = _queue_messages(cur, queue)
            messages[queue] = None if found is None else {m["msg_id"]: m for m in found}

        for t in tasks:
            label = f"task {t['step_slug']}[{t['task_index']}] ({t['status']}) of run {t['run_id']}"
            in_queue = messages.get(t["queue"]) or {}
            finished = (
                t["status"] in TERMINAL_TASK
                or t["run_status"] in TERMINAL_RUN
                or t["step_status"] in TERMINAL_STEP
                or t["dead"]
            )
            msg = in_queue.get(t["message_id"]) if t["message_id"] is not None else None
            if finished and msg is not None:
                problems.append(f"{label}: message {t['message_id']} is still in queue {t['queue']!r}")
            if not finished and require_live_messages:
                if msg is None:
                    problems.append(f"{label}: its message {t['message_id']} is missing from queue {t['queue']!r}")
                else:
                    body = msg["message"]
                    expected = {
                        "flow_slug": t["flow_slug"],
                        "run_id": str(t["run_id"]),
                        "step_slug": t["step_slug"],
                        "task_index": t["task_index"],
                    }
                    if {k: body.get(k) for k in expected} != expected:
                        problems.append(f"{label}: message {t['message_id']} names another task: {body}")

        for row in cur.execute(
            """
            SELECT ss.run_id, ss.step_slug, ss.remaining_tasks,
                   (SELECT count(*) FROM pgflow.step_tasks t
                    WHERE t.run_id = ss.run_id AND t.step_slug = ss.step_slug
                      AND t.status IN ('queued', 'started')) AS live
            FROM pgflow.step_states ss
            JOIN pgflow.runs r ON r.run_id = ss.run_id
            WHERE ss.status = 'started' AND r.status = 'started'
            """
        ).fetchall():
            if row["remaining_tasks"] != row["live"]:
                problems.append(
                    f"started step {row['step_slug']} of run {row['run_id']}: remaining_tasks "
                    f"{row['remaining_tasks']} but {row['live']} queued/started tasks"
                )

        for row in cur.execute(
            """
            SELECT r.run_id, r.status, r.remaining_steps,
                   count(*) FILTER (WHERE ss.status IN ('created', 'started')) AS open_steps,
                   count(*) FILTER (WHERE ss.status = 'failed') AS failed_steps
            FROM pgflow.runs r
            LEFT JOIN pgflow.step_states ss ON ss.run_id = r.run_id
            GROUP BY r.run_id, r.status, r.remaining_steps
            """
        ).fetchall():
            if row["status"] == "started" and row["remaining_steps"] != row["open_steps"]:
                problems.append(
                    f"started run {row['run_id']}: remaining_steps {row['remaining_steps']} but "
                    f"{row['open_steps']} created/started steps"
                )
            if row["status"] == "completed" and (row["open_steps"] or row["failed_steps"]):
                problems.append(f"completed run {row['run_id']} still has open or failed steps")
            if row["status"] == "failed" and not row["failed_steps"]:
                problems.append(f"failed run {row['run_id']} has no failed step")
    return problems


def assert_runtime_invariants(conn: psycopg.Connection, *, require_live_messages: bool = True) -> None:
    """Raise ``AssertionError`` listing every violated runtime invariant."""
    problems = check_runtime_invariants(conn, require_live_messages=require_live_messages)
    assert not problems, "runtime invariants violated:\n  " + "\n  ".join(problems)

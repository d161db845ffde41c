"""Finishing the runs in every state of tests/upgrade/conftest.py with protocol-2 reference workers.

Shared by the upgrade (tests/upgrade/test_upgrade_end_to_end.py) and the adoption
(tests/upstream/test_adopt_inflight.py) end-to-end tests: the same runs are left in flight by
the old runtime, and the same tasks must run exactly once under the new one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from pgflow_cli.worker import Worker, WorkerOptions


def task_rows(conn: psycopg.Connection) -> dict[tuple, dict]:
    """Every task row by ``(run_id, step_slug, task_index)``: status, attempts, message id, output."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute("SELECT run_id, step_slug, task_index, status, attempts_count, message_id, output "
                           "FROM pgflow.step_tasks").fetchall()
    return {(r["run_id"], r["step_slug"], r["task_index"]): r for r in rows}


def run_statuses(conn: psycopg.Connection, state: Any) -> dict[str, str]:
    """``{run name: status}`` of the fixture's runs (``state.runs``)."""
    return {name: conn.execute("SELECT status FROM pgflow.runs WHERE run_id = %s", (run,)).fetchone()[0]
            for name, run in state.runs.items()}


def release_stalled_and_retry(conn: psycopg.Connection, state: Any, before: dict[tuple, dict]) -> None:
    """Make the stuck work claimable now: the vanished worker's 2 started tasks are requeued as the
    cron job would after timeout + 30 s, and the pending retry's message becomes visible instead of
    waiting out its 60 s backoff. ``before``: :func:`task_rows` from before the upgrade."""
    conn.execute("UPDATE pgflow.step_tasks SET queued_at = now() - interval '10 minutes', "
                 "started_at = now() - interval '5 minutes' WHERE status = 'started'")
    assert conn.execute("SELECT pgflow.requeue_stalled_tasks()").fetchone()[0] == 2
    retry = before[(state.runs["retry_pending"], "charge", 0)]
    conn.execute("SELECT pgmq.set_vt('orderflow', %s, 0)", (retry["message_id"],))


def run_workers_until_idle(conninfo: str, conn: psycopg.Connection, make_flows: Callable[[Callable], list],
                           ) -> tuple[list[tuple], dict[tuple, object]]:
    """One reference worker per flow of ``make_flows(wrap)`` (``wrap`` records every handler call)
    until no run is started (60 s at most); each worker stopped and joined, none fatal.

    Returns:
        ``(handled, inputs)``: every ``(run_id, step_slug, task_index)`` handled, in call order,
        and the input each got.
    """
    handled: list[tuple] = []
    inputs: dict[tuple, object] = {}
    lock = threading.Lock()

    def wrap(flow, step, handler):
        def recording(value, ctx):
            with lock:
                handled.append((ctx.run_id, ctx.step_slug, ctx.task_index))
                inputs[(ctx.run_id, ctx.step_slug, ctx.task_index)] = value
            return handler(value, ctx)
        return recording

    workers = [Worker(flow, conninfo, function_name=f"{flow.slug}-v2",
                      options=WorkerOptions(max_poll_seconds=1, heartbeat_interval=1, poll_vt=5))
               for flow in make_flows(wrap)]
    for worker in workers:
        worker.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if conn.execute("SELECT count(*) FROM pgflow.runs WHERE status = 'started'").fetchone()[0] == 0:
                break
            time.sleep(0.2)
    finally:
        for worker in workers:
            worker.stop()
        for worker in workers:
            assert worker.join(30)
    assert all(w.fatal is None for w in workers)
    return handled, inputs


def in_flight_tasks(state: Any) -> set[tuple[str, str, int]]:
    """The tasks the fixture's in-flight runs still have to run, once each (run ids as text)."""
    runs = {k: str(v) for k, v in state.runs.items()}
    return {
        (runs["queued"], "validate", 0), (runs["queued"], "charge", 0), (runs["queued"], "ship", 0),
        (runs["started"], "validate", 0), (runs["started"], "charge", 0), (runs["started"], "ship", 0),
        (runs["retry_pending"], "charge", 0), (runs["retry_pending"], "ship", 0),
        (runs["map_half_done"], "process", 2), (runs["map_half_done"], "process", 3),
        (runs["map_half_done"], "collect", 0),
    }


def assert_every_message_archived(conn: psycopg.Connection, queues: tuple[str, ...]) -> None:
    """Per queue: nothing left in ``q_``, and ``a_`` holds exactly the messages tasks were sent."""
    for queue in queues:
        left = conn.execute(sql.SQL("SELECT count(*) FROM pgmq.{}").format(sql.Identifier(f"q_{queue}"))).fetchone()[0]
        archived = conn.execute(sql.SQL("SELECT count(*) FROM pgmq.{}").format(sql.Identifier(f"a_{queue}"))
                                ).fetchone()[0]
        sent = conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE queue_name = %s AND message_id IS NOT NULL",
                            (queue,)).fetchone()[0]
        assert (left, archived) == (0, sent), queue

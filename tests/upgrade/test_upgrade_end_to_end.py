"""The queue-identity upgrade on a database with runs in every state, finished by new workers.

Pre-upgrade runs: completed, failed, skipped path, queued, started by a worker that vanished,
retry pending (backoff), map fan-out half done. After `pgflow migrate apply`, protocol-2 reference
workers finish all in-flight work through the new paths: nothing lost, nothing run twice, every
message archived, finished runs untouched.
"""

from __future__ import annotations

import threading
import time

from psycopg import sql
from psycopg.rows import dict_row

from pgflow_cli.errors import ExitCode
from pgflow_cli.worker import Worker
from tests.support.cli import run_cli
from tests.support.invariants import assert_runtime_invariants
from tests.upgrade.conftest import flows

QUEUES = ("orderflow", "fanout", "skipper")


def _run_statuses(conn, state) -> dict[str, str]:
    return {name: conn.execute("SELECT status FROM pgflow.runs WHERE run_id = %s", (run,)).fetchone()[0]
            for name, run in state.runs.items()}


def _tasks(conn) -> dict[tuple, dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute("SELECT run_id, step_slug, task_index, status, attempts_count, message_id, output "
                           "FROM pgflow.step_tasks").fetchall()
    return {(r["run_id"], r["step_slug"], r["task_index"]): r for r in rows}


def test_upgrade_carries_every_state_and_new_workers_finish_the_work(pre_upgrade):
    database, state = pre_upgrade
    conn = database.connect()
    assert _run_statuses(conn, state) == {
        "completed": "completed", "failed": "failed", "queued": "started", "started": "started",
        "retry_pending": "started", "map_half_done": "started", "skipped": "completed",
    }
    before = _tasks(conn)

    result = run_cli("migrate", "apply", "--dsn", database.conninfo)
    assert result.code == ExitCode.OK, result.output
    assert "applied 0003_queue_identity" in result.stderr

    # identity persisted for every task, in-flight ones included, and nothing else changed
    assert conn.execute("SELECT pgflow.protocol_version()").fetchone()[0] == 2
    assert set(conn.execute("SELECT DISTINCT flow_slug, queue_name FROM pgflow.step_tasks").fetchall()) == {
        ("orderFlow", "orderflow"), ("fanOut", "fanout"), ("skipper", "skipper")}
    assert set(conn.execute("SELECT DISTINCT flow_slug, queue_name FROM pgflow.steps").fetchall()) == {
        ("orderFlow", "orderflow"), ("fanOut", "fanout"), ("skipper", "skipper")}
    assert {k: {**v} for k, v in _tasks(conn).items()} == before
    # the legacy mixed-case queue keeps its spelling in pgmq.meta; its messages did not move
    assert "orderFlow" in {r[0] for r in conn.execute("SELECT queue_name FROM pgmq.meta").fetchall()}

    # The vanished worker's tasks are recovered as the cron job would after timeout + 30 s.
    conn.execute("UPDATE pgflow.step_tasks SET queued_at = now() - interval '10 minutes', "
                 "started_at = now() - interval '5 minutes' WHERE status = 'started'")
    assert conn.execute("SELECT pgflow.requeue_stalled_tasks()").fetchone()[0] == 2
    # The pending retry becomes visible (instead of waiting its 60 s backoff).
    retry = before[(state.runs["retry_pending"], "charge", 0)]
    conn.execute("SELECT pgmq.set_vt('orderflow', %s, 0)", (retry["message_id"],))

    handled: list[tuple] = []
    lock = threading.Lock()

    def wrap(flow, step, handler):
        def recording(value, ctx):
            with lock:
                handled.append((ctx.run_id, ctx.step_slug, ctx.task_index))
            return handler(value, ctx)
        return recording

    workers = [Worker(flow, database.conninfo, function_name=f"{flow.slug}-v2", max_poll_seconds=1,
                      heartbeat_interval=1, poll_vt=5) for flow in flows(wrap)]
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

    statuses = _run_statuses(conn, state)
    assert statuses == {
        "completed": "completed", "failed": "failed", "queued": "completed", "started": "completed",
        "retry_pending": "completed", "map_half_done": "completed", "skipped": "completed",
    }
    runs = state.runs
    expected = {
        (str(runs["queued"]), "validate", 0), (str(runs["queued"]), "charge", 0), (str(runs["queued"]), "ship", 0),
        (str(runs["started"]), "validate", 0), (str(runs["started"]), "charge", 0), (str(runs["started"]), "ship", 0),
        (str(runs["retry_pending"]), "charge", 0), (str(runs["retry_pending"]), "ship", 0),
        (str(runs["map_half_done"]), "process", 2), (str(runs["map_half_done"]), "process", 3),
        (str(runs["map_half_done"]), "collect", 0),
    }
    assert sorted(handled) == sorted(expected), "every in-flight task ran exactly once, nothing else ran"

    after = _tasks(conn)
    for key, row in before.items():  # work finished before the upgrade was left alone
        if row["status"] in ("completed", "failed", "skipped", "cancelled"):
            assert after[key] == row
    assert after[(runs["started"], "validate", 0)]["attempts_count"] == 2
    assert after[(runs["retry_pending"], "charge", 0)]["attempts_count"] == 2
    assert after[(runs["map_half_done"], "process", 2)]["attempts_count"] == 2
    output = conn.execute("SELECT output FROM pgflow.runs WHERE run_id = %s", (runs["map_half_done"],)).fetchone()[0]
    assert output == {"collect": 100}  # 10 + 20 (before) + 30 + 40 (after)

    for queue in QUEUES:
        left = conn.execute(sql.SQL("SELECT count(*) FROM pgmq.{}").format(sql.Identifier(f"q_{queue}"))).fetchone()[0]
        archived = conn.execute(sql.SQL("SELECT count(*) FROM pgmq.{}").format(sql.Identifier(f"a_{queue}"))).fetchone()[0]
        sent = conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE queue_name = %s AND message_id IS NOT NULL",
                            (queue,)).fetchone()[0]
        assert (left, archived) == (0, sent), queue
    assert_runtime_invariants(conn)

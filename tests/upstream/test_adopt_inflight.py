"""The published 0.8.1 database with runs in every state: adopt, upgrade (0003), finish with new workers.

Runs were left by the 0.8.1 functions: completed, failed, queued, started by a worker that
vanished, retry pending (backoff), map fan-out half done. After adoption and the queue-identity
upgrade, protocol-2 reference workers finish every in-flight run: each task runs exactly once,
every message is archived, and finished work is left as it was.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from pgflow_cli import installer
from pgflow_cli.errors import ExitCode
from pgflow_cli.upstream import adopt as adoption
from pgflow_cli.upstream import recognise as rec
from pgflow_cli.worker import Worker
from tests.support.cli import run_cli
from tests.support.invariants import assert_runtime_invariants
from tests.upgrade.conftest import flows

QUEUES = ("orderflow", "fanout")


def _tasks(conn) -> dict[tuple, dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute("SELECT run_id, step_slug, task_index, status, attempts_count, message_id, output "
                           "FROM pgflow.step_tasks").fetchall()
    return {(r["run_id"], r["step_slug"], r["task_index"]): r for r in rows}


def _statuses(conn, state) -> dict[str, str]:
    return {name: conn.execute("SELECT status FROM pgflow.runs WHERE run_id = %s", (run,)).fetchone()[0]
            for name, run in state.runs.items()}


FINISHED_OUTPUTS = {("completed", "validate"): {"ok": True}, ("completed", "charge"): {"charged": 10},
                    ("completed", "ship"): {"parcel": "p1"}}
"""The completed steps of runs finished before adoption (what the history backfill fills)."""


def _finished_outputs(conn, state) -> dict[tuple[str, str], object]:
    return {(name, step): conn.execute("SELECT output FROM pgflow.step_states WHERE run_id = %s AND step_slug = %s",
                                       (state.runs[name], step)).fetchone()[0]
            for name, step in FINISHED_OUTPUTS}


@pytest.mark.parametrize("online", ["never", "always"])
def test_adopted_release_finishes_every_run_exactly_once(inflight_db, online):
    """``never``: the whole adoption in one transaction. ``always`` (a large database's path): only
    the runs in flight are backfilled inside it, and the workers finish them while the history
    backfill of finished runs has not run yet; it runs after them and fills the rest."""
    database, state = inflight_db
    conn = database.connect()
    before = _tasks(conn)
    assert _statuses(conn, state) == {"completed": "completed", "failed": "failed", "queued": "started",
                                      "started": "started", "retry_pending": "started", "map_half_done": "started"}

    with psycopg.connect(database.conninfo, autocommit=True) as migrator:
        adoption.adopt(migrator, rec.recognise(migrator), online=online)
        if online == "never":
            result = run_cli("migrate", "apply", "--dsn", database.conninfo)
            assert result.code == ExitCode.OK, result.output
            assert "applied 0003_queue_identity" in result.stderr
        else:  # the migrations, as `migrate apply` runs them before the history backfill
            assert "0003_queue_identity" in [a.migration.label for a in installer.apply(migrator)]
            assert adoption.history_pending(migrator) is not None
    deferred = online == "always"
    assert _finished_outputs(conn, state) == ({key: None for key in FINISHED_OUTPUTS} if deferred
                                              else FINISHED_OUTPUTS)

    assert conn.execute("SELECT pgflow.protocol_version()").fetchone()[0] == 2
    assert {k: {**v} for k, v in _tasks(conn).items()} == before  # the upgrade moved no task

    # The vanished worker's tasks are recovered as the cron job would after timeout + 30 s.
    conn.execute("UPDATE pgflow.step_tasks SET queued_at = now() - interval '10 minutes', "
                 "started_at = now() - interval '5 minutes' WHERE status = 'started'")
    assert conn.execute("SELECT pgflow.requeue_stalled_tasks()").fetchone()[0] == 2
    # The pending retry becomes visible (instead of waiting out its 60 s backoff).
    retry = before[(state.runs["retry_pending"], "charge", 0)]
    conn.execute("SELECT pgmq.set_vt('orderflow', %s, 0)", (retry["message_id"],))

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

    workers = [Worker(flow, database.conninfo, function_name=f"{flow.slug}-v2", max_poll_seconds=1,
                      heartbeat_interval=1, poll_vt=5) for flow in flows(wrap)[:2]]
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

    assert _statuses(conn, state) == {"completed": "completed", "failed": "failed", "queued": "completed",
                                      "started": "completed", "retry_pending": "completed",
                                      "map_half_done": "completed"}
    runs = {k: str(v) for k, v in state.runs.items()}
    expected = {
        (runs["queued"], "validate", 0), (runs["queued"], "charge", 0), (runs["queued"], "ship", 0),
        (runs["started"], "validate", 0), (runs["started"], "charge", 0), (runs["started"], "ship", 0),
        (runs["retry_pending"], "charge", 0), (runs["retry_pending"], "ship", 0),
        (runs["map_half_done"], "process", 2), (runs["map_half_done"], "process", 3),
        (runs["map_half_done"], "collect", 0),
    }
    assert sorted(handled) == sorted(expected), "every in-flight task ran exactly once, nothing else ran"
    # inputs follow the baseline contract; outputs from before adoption feed them (the backfill)
    assert inputs[(runs["retry_pending"], "charge", 0)] == {"validate": {"ok": True}}
    assert inputs[(runs["map_half_done"], "process", 2)] == 3
    assert inputs[(runs["map_half_done"], "collect", 0)] == {"process": [10, 20, 30, 40]}
    output = conn.execute("SELECT output FROM pgflow.runs WHERE run_id = %s", (state.runs["map_half_done"],)
                          ).fetchone()[0]
    assert output == {"collect": 100}

    after = _tasks(conn)
    for key, row in before.items():  # work finished before adoption was left alone
        if row["status"] in ("completed", "failed"):
            assert after[key] == row
    assert after[(state.runs["started"], "validate", 0)]["attempts_count"] == 2
    assert after[(state.runs["retry_pending"], "charge", 0)]["attempts_count"] == 2

    for queue in QUEUES:
        left = conn.execute(sql.SQL("SELECT count(*) FROM pgmq.{}").format(sql.Identifier(f"q_{queue}"))).fetchone()[0]
        archived = conn.execute(sql.SQL("SELECT count(*) FROM pgmq.{}").format(sql.Identifier(f"a_{queue}"))
                                ).fetchone()[0]
        sent = conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE queue_name = %s AND message_id IS NOT NULL",
                            (queue,)).fetchone()[0]
        assert (left, archived) == (0, sent), queue
    assert_runtime_invariants(conn)

    if deferred:  # now the history: every finished run's outputs, and nothing else changed
        finished = _tasks(conn)
        result = run_cli("migrate", "apply", "--dsn", database.conninfo)
        assert result.code == ExitCode.OK, result.output
        assert "history backfill (adoption, online)" in result.stdout
        with psycopg.connect(database.conninfo) as check:
            assert adoption.history_pending(check) is None
        assert _finished_outputs(conn, state) == FINISHED_OUTPUTS
        assert _tasks(conn) == finished
        assert_runtime_invariants(conn)

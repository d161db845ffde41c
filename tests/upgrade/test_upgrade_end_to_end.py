"""The queue-identity upgrade on a database with runs in every state, finished by new workers.

Pre-upgrade runs: completed, failed, skipped path, queued, started by a worker that vanished,
retry pending (backoff), map fan-out half done. After `pgflow migrate apply`, protocol-2 reference
workers finish all in-flight work through the new paths: nothing lost, nothing run twice, every
message archived, finished runs untouched.
"""

from __future__ import annotations

from pgflow_cli.errors import ExitCode
from tests.support import inflight
from tests.support.cli import run_cli
from tests.support.invariants import assert_runtime_invariants
from tests.upgrade.conftest import flows

QUEUES = ("orderflow", "fanout", "skipper")


def test_upgrade_carries_every_state_and_new_workers_finish_the_work(pre_upgrade):
    database, state = pre_upgrade
    conn = database.connect()
    assert inflight.run_statuses(conn, state) == {
        "completed": "completed", "failed": "failed", "queued": "started", "started": "started",
        "retry_pending": "started", "map_half_done": "started", "skipped": "completed",
    }
    before = inflight.task_rows(conn)

    result = run_cli("migrate", "apply", "--dsn", database.conninfo)
    assert result.code == ExitCode.OK, result.output
    assert "applied 0003_queue_stage" in result.stderr

    # identity persisted for every task, in-flight ones included, and nothing else changed
    assert conn.execute("SELECT pgflow.protocol_version()").fetchone()[0] == 2
    assert set(conn.execute("SELECT DISTINCT flow_slug, queue_name FROM pgflow.step_tasks").fetchall()) == {
        ("orderFlow", "orderflow"), ("fanOut", "fanout"), ("skipper", "skipper")}
    assert set(conn.execute("SELECT DISTINCT flow_slug, queue_name FROM pgflow.steps").fetchall()) == {
        ("orderFlow", "orderflow"), ("fanOut", "fanout"), ("skipper", "skipper")}
    assert {k: {**v} for k, v in inflight.task_rows(conn).items()} == before
    # the legacy mixed-case queue keeps its spelling in pgmq.meta; its messages did not move
    assert "orderFlow" in {r[0] for r in conn.execute("SELECT queue_name FROM pgmq.meta").fetchall()}

    inflight.release_stalled_and_retry(conn, state, before)
    handled, _inputs = inflight.run_workers_until_idle(database.conninfo, conn, flows)

    statuses = inflight.run_statuses(conn, state)
    assert statuses == {
        "completed": "completed", "failed": "failed", "queued": "completed", "started": "completed",
        "retry_pending": "completed", "map_half_done": "completed", "skipped": "completed",
    }
    runs = state.runs
    expected = inflight.in_flight_tasks(state)
    assert sorted(handled) == sorted(expected), "every in-flight task ran exactly once, nothing else ran"

    after = inflight.task_rows(conn)
    for key, row in before.items():  # work finished before the upgrade was left alone
        if row["status"] in ("completed", "failed", "skipped", "cancelled"):
            assert after[key] == row
    assert after[(runs["started"], "validate", 0)]["attempts_count"] == 2
    assert after[(runs["retry_pending"], "charge", 0)]["attempts_count"] == 2
    assert after[(runs["map_half_done"], "process", 2)]["attempts_count"] == 2
    output = conn.execute("SELECT output FROM pgflow.runs WHERE run_id = %s", (runs["map_half_done"],)).fetchone()[0]
    assert output == {"collect": 100}  # 10 + 20 (before) + 30 + 40 (after)

    inflight.assert_every_message_archived(conn, QUEUES)
    assert_runtime_invariants(conn)

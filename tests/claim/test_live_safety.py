"""Schema 0004 (live safety): a claim on a queue that lost a table takes the fatal path before any
handler runs, and a worker id reused for another route is refused without touching that route's
function (docs/claim-protocol.md)."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from tests.claim.helpers import ClaimEnv


@pytest.fixture
def plain(cl: ClaimEnv):
    """Flow alpha (one step), one queued run, a registered alpha worker."""
    cl.flow("alpha", [{"slug": "a"}])
    run = cl.start("alpha", {})
    return {"run": run, "worker": cl.worker("alpha")}


def _claim_after_dropping(cl, plain, table):
    batch = cl.read("alpha")
    cl.conn.execute(f"DROP TABLE pgmq.{table}")
    result = cl.claim("alpha", batch, plain["worker"], "alpha")
    return batch, result


def _assert_fatal_stop(cl, plain, result, batch, reason):
    assert result.outcomes == {m: ("fatal", reason) for m in batch}
    assert result.claimed == []
    task = cl.task(plain["run"], "a")
    assert (task["status"], task["attempts_count"]) == ("queued", 0)  # no attempt burnt, no handler run
    function = cl.function_row("alpha-worker", cl.connect())
    assert function["enabled"] is False and f"message {batch[0]} {reason}" in function["paused_reason"]
    assert cl.worker_row(plain["worker"])["deprecated_at"] is not None
    [warning] = result.warnings()
    assert reason in warning.message
    cl.conn.execute("SELECT pgmq.create('alpha')")  # the documented fix: recreate what is missing


def test_a_queue_without_its_archive_table_is_fatal_before_any_handler_runs(cl, plain):
    batch, result = _claim_after_dropping(cl, plain, "a_alpha")
    _assert_fatal_stop(cl, plain, result, batch, "archive_table_missing")
    # the batch was made visible again, for the workers once the queue is fixed
    assert cl.visible_now("alpha", batch) == {m: True for m in batch}


def test_a_queue_without_its_queue_table_is_fatal_not_missing(cl, plain):
    batch, result = _claim_after_dropping(cl, plain, "q_alpha")
    _assert_fatal_stop(cl, plain, result, batch, "queue_table_missing")
    # the message went with the table: nothing can run this task any more; remove the flow's data
    cl.conn.execute("SELECT pgflow.delete_flow_and_data('alpha')")


def _reuse_id_for_beta(cl, worker_id):
    """The alpha worker row is pruned and its id registered again, for flow beta."""
    cl.flow("beta", [{"slug": "b"}])
    beta_run = cl.start("beta", {})
    cl.conn.execute("DELETE FROM pgflow.workers WHERE worker_id = %s", (worker_id,))
    cl.conn.execute("SELECT pgflow.register_worker(%s, 'beta-worker', 'beta', 'beta')", (worker_id,))
    return beta_run


def test_a_stale_process_claiming_under_a_reused_id_is_refused_and_pauses_nothing(cl, plain):
    worker = plain["worker"]
    _reuse_id_for_beta(cl, worker)
    batch = cl.read("alpha")
    before = cl.snapshot()
    with pytest.raises(psycopg.Error) as refused:
        cl.claim("alpha", batch, worker, "alpha")
    assert refused.value.sqlstate == "PF007"
    assert "registered for" in str(refused.value) and "beta" in str(refused.value)
    assert cl.snapshot(cl.connect()) == before  # nothing claimed, archived or released
    assert cl.function_row("beta-worker")["enabled"] is True  # beta's function is not paused
    assert cl.worker_row(worker)["deprecated_at"] is None  # beta's worker keeps running


def test_a_stale_process_heartbeating_under_a_reused_id_is_refused(cl, plain):
    worker = plain["worker"]
    _reuse_id_for_beta(cl, worker)
    beat_before = cl.worker_row(worker)["last_heartbeat_at"]
    with pytest.raises(psycopg.Error) as refused:
        cl.conn.execute("SELECT pgflow.send_heartbeat(%s, 'alpha-worker', 'alpha', 'alpha', NULL)", (worker,))
    assert refused.value.sqlstate == "PF007"
    assert cl.worker_row(worker)["last_heartbeat_at"] == beat_before  # not answered as beta
    # the real owner of the id still heartbeats normally
    assert cl.val("SELECT pgflow.send_heartbeat(%s, 'beta-worker', 'beta', 'beta', NULL)", (worker,)) is False


def test_roles_that_could_heartbeat_get_the_route_checked_heartbeat(baseline_db):
    from pgflow_cli import installer

    conn = baseline_db.connect()
    role = f"hb_{uuid.uuid4().hex[:8]}"
    conn.execute(f'CREATE ROLE "{role}"')
    try:
        conn.execute(f'GRANT EXECUTE ON FUNCTION pgflow.send_heartbeat(uuid) TO "{role}"')
        installer.apply(conn)
        checked = "pgflow.send_heartbeat(uuid, text, text, text, text)"
        assert conn.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE')", (role, checked)).fetchone()[0]
        assert not conn.execute("SELECT has_function_privilege('public', %s, 'EXECUTE')", (checked,)).fetchone()[0]
    finally:
        conn.execute(f'DROP OWNED BY "{role}"')
        conn.execute(f'DROP ROLE "{role}"')

"""The startup compatibility boundary: mismatched workers are refused before registering or polling."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_cli import installer
from pgflow_cli.worker import Flow, ProtocolMismatch, ProtocolV1, ProtocolV2, Worker, WorkerOptions
from tests.upgrade.conftest import flows


def _footprint(conn):
    """What a worker could have changed: worker rows, functions, flows, message reads."""
    return (
        conn.execute("SELECT count(*) FROM pgflow.workers").fetchone()[0],
        conn.execute("SELECT count(*) FROM pgflow.worker_functions").fetchone()[0],
        conn.execute("SELECT count(*) FROM pgflow.flows").fetchone()[0],
        conn.execute("SELECT coalesce(sum(read_ct), 0) FROM pgmq.q_orderflow").fetchone()[0],
    )


def test_an_old_worker_is_refused_by_an_upgraded_database(pre_upgrade):
    database, _state = pre_upgrade
    conn = database.connect()
    installer.apply(conn)
    before = _footprint(conn)
    worker = Worker(flows()[0], database.conninfo, function_name="order-worker", protocol=ProtocolV1())
    with pytest.raises(ProtocolMismatch) as info:
        worker.start()
    assert "worker speaks pgflow protocol 1, database speaks protocol 2" in info.value.message
    assert "protocol 2" in info.value.hint and "coordinated" in info.value.hint
    assert _footprint(conn) == before
    assert worker.state == "stopped"


def test_a_released_worker_skipping_the_version_check_is_refused_by_the_startup_function(pre_upgrade):
    """A protocol-1 worker that calls the released startup function directly gets PF002, nothing compiled."""
    database, _state = pre_upgrade
    conn = database.connect()
    installer.apply(conn)
    before = _footprint(conn)
    shape = Flow("newFlow").step("a", lambda r, c: r).shape()
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT pgflow.ensure_flow_compiled(%s, %s)", ("newFlow", Jsonb(shape)))
    assert info.value.sqlstate == "PF002"
    assert "protocol 1" in str(info.value) and "protocol 2" in str(info.value)
    assert "pgflow-cli with the queue-identity upgrade" in (info.value.diag.message_hint or "")
    with pytest.raises(psycopg.Error) as claim:
        conn.execute("SELECT * FROM pgflow.start_tasks('orderFlow', ARRAY[1]::bigint[], gen_random_uuid())")
    assert claim.value.sqlstate == "PF002"
    assert _footprint(conn) == before


def test_a_new_worker_is_refused_by_a_database_that_was_not_upgraded(pre_upgrade):
    database, _state = pre_upgrade
    conn = database.connect()
    before = _footprint(conn)
    worker = Worker(flows()[0], database.conninfo, function_name="order-worker", protocol=ProtocolV2())
    with pytest.raises(ProtocolMismatch) as info:
        worker.start()
    assert "worker speaks pgflow protocol 2, database speaks protocol 1" in info.value.message
    assert "pgflow migrate apply" in info.value.hint
    assert _footprint(conn) == before


def test_a_new_worker_calling_the_new_startup_function_on_an_old_database_gets_no_function(pre_upgrade):
    """Without the version check, the protocol-2 startup call simply does not exist before the upgrade."""
    database, _state = pre_upgrade
    conn = database.connect()
    shape = flows()[0].shape()
    with pytest.raises(psycopg.errors.UndefinedFunction):
        conn.execute("SELECT pgflow.ensure_flow_compiled(%s, %s, protocol_version => 2)", ("orderFlow", Jsonb(shape)))


def test_the_cli_maps_a_protocol_refusal_to_exit_6(pre_upgrade):
    from pgflow_cli.db import map_database_error
    from pgflow_cli.errors import ExitCode

    database, _state = pre_upgrade
    conn = database.connect()
    installer.apply(conn)
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT pgflow.ensure_flow_compiled('x', '{\"steps\": []}')")
    mapped = map_database_error(info.value)
    assert mapped.exit_code == ExitCode.CONFLICT and mapped.hint


def test_a_protocol_1_worker_left_running_through_the_upgrade_stops_and_hides_nothing(pre_upgrade):
    """The released worker keeps polling while `migrate apply` runs; its first claim afterwards gets
    PF002: it must stop for good (not retry) and hand the batch back at once, so protocol-2 workers
    see the messages immediately instead of after the read's visibility timeout."""
    database, _state = pre_upgrade
    conn = database.connect()
    flow = Flow("keepFlow").step("only", lambda run, ctx: {"by": "old"})
    old = Worker(flow, database.conninfo, function_name="keep-old", protocol=ProtocolV1(),
                 options=WorkerOptions(poll_vt=300, max_poll_seconds=1, heartbeat_interval=3600))
    old.start()
    try:
        installer.apply(conn)
        run_id = conn.execute("SELECT run_id FROM pgflow.start_flow('keepFlow', '{}'::jsonb)").fetchone()[0]
        assert old.join(60), "the protocol-1 worker kept retrying after the upgrade"
    finally:
        old.stop()
        old.join(30)
    assert old.fatal and "protocol 1" in old.fatal
    assert old.stats.snapshot()["messages_read"] >= 1  # it did read the new message ...
    visible, reads = conn.execute(
        "SELECT q.vt <= clock_timestamp(), q.read_ct FROM pgmq.q_keepflow AS q "
        "JOIN pgflow.step_tasks AS t ON t.message_id = q.msg_id WHERE t.run_id = %s", (run_id,)).fetchone()
    assert reads >= 1 and visible  # ... and handed it back instead of hiding it for 300 s
    assert conn.execute("SELECT status FROM pgflow.step_tasks WHERE run_id = %s", (run_id,)).fetchone()[0] == "queued"


@pytest.mark.parametrize("protocol_class", [ProtocolV1, ProtocolV2], ids=["protocol-1", "protocol-2"])
def test_the_attempts_of_a_claim_batch_are_read_in_one_query(request, protocol_class):
    """What TaskContext.attempt reads (for a whole claim batch, on first use), on each protocol's schema."""
    import uuid

    database = request.getfixturevalue("baseline_db" if protocol_class is ProtocolV1 else "db")
    conn = database.connect()
    protocol, worker_id = protocol_class(), str(uuid.uuid4())
    protocol.compile(conn, "attemptsFlow", Flow("attemptsFlow", max_attempts=3, base_delay=0)
                     .step("only", lambda v, ctx: v).shape(), None)
    queue = protocol.queue_name("attemptsFlow", None)
    protocol.register(conn, worker_id=worker_id, function_name="attempts-fn", queue_name=queue,
                      flow_slug="attemptsFlow", step_slug=None)
    conn.execute("SELECT pgflow.start_flow('attemptsFlow', '{}'::jsonb) FROM generate_series(1, 2)")

    def claim() -> dict[int, int]:
        ids = protocol.read(conn, queue_name=queue, vt=30, qty=5, max_poll_seconds=1, poll_interval_ms=20)
        tasks = protocol.claim(conn, flow_slug="attemptsFlow", step_slug=None, queue_name=queue, message_ids=ids,
                               worker_id=worker_id).claimed
        assert {task.attempt for task in tasks} == {None}  # a claim does not read them
        return protocol.claimed_attempts(conn, flow_slug="attemptsFlow", queue_name=queue,
                                         message_ids=[task.message_id for task in tasks], worker_id=worker_id)

    first = claim()
    assert sorted(first.values()) == [1, 1]
    retried = min(first)
    conn.execute("SELECT pgflow.fail_task(run_id, step_slug, task_index, 'again') FROM pgflow.step_tasks "
                 "WHERE message_id = %s", (retried,))
    assert claim() == {retried: 2}

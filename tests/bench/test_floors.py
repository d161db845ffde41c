"""The floors of bench/benchmarks/claim_floor.py and cycle_floor.py write what pgflow writes.

Those benchmarks claim that no claim, and no task's cycle, can cost less than their plain SQL,
because the SQL writes exactly the rows the engine writes and nothing more. These tests hold the
"exactly": if the claim or a report starts writing another column, or the floor drifts from the
engine, a test here fails and the benchmark has to follow. Rows are compared, never times.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from bench.benchmarks.claim import FLOOR_UPDATE
from bench.benchmarks.cycle_floor import STEPS, FloorDriver
from bench.benchmarks.server_time import linear_flow
from pgflow_cli.worker import Flow
from pgflow_cli.worker.protocol import LATEST, ProtocolV2


def _noop(value, ctx):
    return None


def _task(conn: psycopg.Connection, queue: str, msg_id: int) -> dict[str, Any]:
    return conn.execute("SELECT to_jsonb(t) FROM pgflow.step_tasks AS t WHERE queue_name = %s AND message_id = %s",
                        (queue, msg_id)).fetchone()[0]


def _engine(conn: psycopg.Connection, flow: Flow) -> tuple[ProtocolV2, str, str]:
    """The latest protocol with ``flow`` compiled and a worker registered: (protocol, queue, worker id)."""
    protocol = LATEST()
    queue = protocol.queue_name(flow.slug, None)
    worker = str(uuid.uuid4())
    protocol.compile(conn, flow.slug, flow.shape(), None)
    protocol.register(conn, worker_id=worker, function_name="test", queue_name=queue, flow_slug=flow.slug,
                      step_slug=None)
    return protocol, queue, worker


def _changed(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    return {key for key in after if after[key] != before.get(key)}


def test_the_claim_floor_writes_the_columns_a_claim_writes_with_the_same_values(db):
    conn = db.connect()
    protocol, queue, worker = _engine(conn, Flow("floorClaim").step("only", _noop))
    conn.execute("SELECT count(*) FROM generate_series(1, 2) AS i, "
                 "LATERAL pgflow.start_flow('floorClaim', jsonb_build_object('i', i))")
    claimed_id, floored_id = protocol.read(conn, queue_name=queue, vt=30, qty=2, max_poll_seconds=1,
                                           poll_interval_ms=10)
    before = {m: _task(conn, queue, m) for m in (claimed_id, floored_id)}

    outcome = protocol.claim(conn, flow_slug="floorClaim", step_slug=None, queue_name=queue,
                             message_ids=[claimed_id], worker_id=worker)
    assert [t.message_id for t in outcome.claimed] == [claimed_id]
    floored = conn.execute(FLOOR_UPDATE, {"worker_id": worker, "ids": [floored_id], "queue": queue}).rowcount
    assert floored == 1

    claim_after, floor_after = _task(conn, queue, claimed_id), _task(conn, queue, floored_id)
    changed = _changed(before[claimed_id], claim_after)
    assert changed == _changed(before[floored_id], floor_after)
    assert changed >= {"status", "attempts_count", "started_at", "last_worker_id"}
    for key in changed - {"started_at"}:
        assert claim_after[key] == floor_after[key], key
    # the floor skips a task that is no longer queued, as the claim's guard does
    assert conn.execute(FLOOR_UPDATE, {"worker_id": worker, "ids": [floored_id], "queue": queue}).rowcount == 0


RUN_STATE = """
SELECT jsonb_build_object(
  'runs', (SELECT jsonb_agg(jsonb_build_object(
             'status', r.status, 'remaining_steps', r.remaining_steps, 'output', r.output,
             'completed', r.completed_at IS NOT NULL, 'failed', r.failed_at IS NOT NULL) ORDER BY r.input ->> 'i')
           FROM pgflow.runs AS r WHERE r.flow_slug = %(flow)s),
  'step_states', (SELECT jsonb_agg(jsonb_build_object(
             'step', s.step_slug, 'status', s.status, 'remaining_deps', s.remaining_deps,
             'initial_tasks', s.initial_tasks, 'remaining_tasks', s.remaining_tasks, 'output', s.output,
             'started', s.started_at IS NOT NULL, 'completed', s.completed_at IS NOT NULL)
             ORDER BY r.input ->> 'i', s.step_slug)
           FROM pgflow.step_states AS s JOIN pgflow.runs AS r USING (run_id) WHERE s.flow_slug = %(flow)s),
  'step_tasks', (SELECT jsonb_agg(jsonb_build_object(
             'step', t.step_slug, 'index', t.task_index, 'status', t.status, 'attempts', t.attempts_count,
             'output', t.output, 'worker', t.last_worker_id IS NOT NULL, 'message', t.message_id IS NOT NULL,
             'started', t.started_at IS NOT NULL, 'completed', t.completed_at IS NOT NULL)
             ORDER BY r.input ->> 'i', t.step_slug)
           FROM pgflow.step_tasks AS t JOIN pgflow.runs AS r USING (run_id) WHERE t.flow_slug = %(flow)s),
  'queued', (SELECT count(*) FROM pgmq.metrics(%(queue)s) AS m WHERE m.queue_length > 0),
  'archived', (SELECT m.total_messages - m.queue_length FROM pgmq.metrics(%(queue)s) AS m))
"""


def test_the_cycle_floor_leaves_the_rows_the_engine_leaves(db):
    conn = db.connect()
    runs = 12  # more than one read batch per stage, so batches mix runs

    floor = FloorDriver(conn, "floorCycle")
    floor.cycle(runs)

    protocol, queue, worker = _engine(conn, linear_flow("engineCycle"))
    conn.execute("SELECT count(*) FROM generate_series(1, %s) AS i, "
                 "LATERAL pgflow.start_flow('engineCycle', jsonb_build_object('i', i))", (runs,))
    done = 0
    while done < runs * len(STEPS):
        ids = protocol.read(conn, queue_name=queue, vt=30, qty=10, max_poll_seconds=1, poll_interval_ms=10)
        assert ids, f"the engine's queue ran dry after {done} tasks"
        claimed = protocol.claim(conn, flow_slug="engineCycle", step_slug=None, queue_name=queue, message_ids=ids,
                                 worker_id=worker).claimed
        protocol.complete_many(conn, [(task, None) for task in claimed])
        done += len(claimed)

    engine = conn.execute(RUN_STATE, {"flow": "engineCycle", "queue": queue}).fetchone()[0]
    floored = conn.execute(RUN_STATE, {"flow": "floorCycle", "queue": floor.queue}).fetchone()[0]
    assert len(engine["runs"]) == runs and len(engine["step_tasks"]) == runs * len(STEPS)
    assert engine["archived"] == runs * len(STEPS)
    assert floored == engine

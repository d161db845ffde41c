"""What a claim of plain queued work costs in statements and row reads (the queue stage, 0003).

* A batch whose every message is claimable queued work runs a fixed, short list of statements:
  the look-up of batch, worker and route, the two lock statements, the body read, one statement
  that classifies the batch and claims it, the visibility helper's look-up and UPDATE, and the
  result. Before 0015 the classification and the claim were separate statements and the route
  took three (14 statements with the call).
* A map task is updated through the row its lock found (a TID scan), never through
  ``idx_step_tasks_queued``, whose entries for (run_id, step_slug) are shared by every queued
  sibling of a 10,000-task map (0012's UPDATE took that index before any ANALYZE).
* Every statement is planned once per session (generic plans from the first call): PL/pgSQL's five
  custom plans re-planned every statement of the first five claims of each session, about half of
  such a claim's CPU (a fresh worker connection, or the claim_scaling bench's map samples).
* The array a map's tasks index into (a root map's run input, a dependent map's dependency output)
  is read from its TOAST table once per claim, not once per claimed task (0012 read a dependent
  map's output once per task).

Plan shapes and row counts are asserted, never times.
"""

from __future__ import annotations

import re
import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.claim.helpers import nested_plans

CLAIM = "SELECT * FROM pgflow.claim_tasks(%s, %s::bigint[], %s, %s)"
FOREIGN_KEY_CHECK = "FOR KEY SHARE OF x"  # the RI trigger's per-row look-up of last_worker_id


def _worker(conn: psycopg.Connection, flow: str) -> uuid.UUID:
    worker = uuid.uuid4()
    conn.execute("SELECT pgflow.register_worker(%s, 'test-worker', %s, %s)", (worker, flow, flow))
    return worker


def _read(conn: psycopg.Connection, queue: str, qty: int = 10) -> list[int]:
    return [r[0] for r in conn.execute("SELECT msg_id FROM pgmq.read(%s, 30, %s)", (queue, qty)).fetchall()]


def _claimed(conn: psycopg.Connection, queue: str, ids: list[int], worker: uuid.UUID) -> list[tuple]:
    rows = conn.execute("SELECT outcome, run_id, step_slug, task_index, input FROM pgflow.claim_tasks(%s, %s, %s, %s)",
                        (queue, ids, worker, queue)).fetchall()
    assert [r[0] for r in rows] == ["claimed"] * len(ids), rows
    return rows


def test_a_batch_of_queued_work_is_classified_and_claimed_in_one_statement(db):
    conn = db.connect()
    conn.execute("SELECT pgflow.create_flow('plain')")
    conn.execute("SELECT pgflow.add_step('plain', 'only')")
    worker = _worker(conn, "plain")
    conn.execute("SELECT count(*) FROM generate_series(1, 10) AS i, LATERAL pgflow.start_flow('plain', jsonb_build_object('i', i))")
    ids = _read(conn, "plain")

    plans = [p for p in nested_plans(conn, CLAIM, ("plain", ids, worker, "plain")) if FOREIGN_KEY_CHECK not in p]

    statements = "\n=====\n".join(plans)
    # the call itself, look-up, run locks, task locks, body read, classify + claim, the visibility
    # helper (its task look-up and its UPDATE), result
    assert len(plans) <= 9, f"{len(plans)} statements:\n{statements}"
    updates = [p for p in plans if "Update on step_tasks" in p]
    assert len(updates) == 1, statements
    assert "idx_step_tasks_queue_message" in updates[0] and "CTE judged" in updates[0], updates[0]
    queue_updates = [p for p in plans if "Update on q_plain" in p]
    assert len(queue_updates) == 1, statements
    assert conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE status = 'started' AND attempts_count = 1").fetchone()[0] == 10
    hidden = conn.execute("SELECT count(*) FROM pgmq.q_plain WHERE vt > clock_timestamp() + interval '40 seconds'").fetchone()[0]
    assert hidden == 10  # effective timeout (60 s default) + 2 s, beyond the read's 30 s


def test_the_first_claims_of_a_session_use_generic_plans(db):
    """A custom plan shows the values of the call (the worker id, the queue name) in its conditions;
    a generic plan, made once and kept for the session, shows parameters instead."""
    conn = db.connect()
    conn.execute("SELECT pgflow.create_flow('fresh')")
    conn.execute("SELECT pgflow.add_step('fresh', 'only')")
    worker = _worker(conn, "fresh")
    conn.execute("SELECT count(*) FROM generate_series(1, 20) AS i, LATERAL pgflow.start_flow('fresh', jsonb_build_object('i', i))")
    session = db.connect()  # a new backend: nothing planned yet
    plans = nested_plans(session, CLAIM, ("fresh", _read(session, "fresh"), worker, "fresh"))
    plans += nested_plans(session, CLAIM, ("fresh", _read(session, "fresh"), worker, "fresh"))

    literal = [p for p in plans if f"'{worker}'::uuid" in p or "'fresh'::text" in p]
    assert not literal, "\n=====\n".join(literal)
    assert session.execute("SELECT count(*) FROM pgflow.step_tasks WHERE status = 'started'").fetchone()[0] == 20


def test_a_10k_map_task_is_updated_by_its_row_even_with_generic_plans_and_no_statistics(db):
    conn = db.connect()
    for table in ("runs", "step_states", "step_tasks"):
        conn.execute(f"ALTER TABLE pgflow.{table} SET (autovacuum_enabled = off)")
    conn.execute("SELECT pgflow.create_flow('wide')")
    conn.execute("SELECT pgflow.add_step('wide', 'each', step_type => 'map')")
    worker = _worker(conn, "wide")
    conn.execute("SELECT pgflow.start_flow('wide', %s)", (Jsonb(list(range(10_000))),))
    for _ in range(7):  # past PL/pgSQL's five custom plans
        _claimed(conn, "wide", _read(conn, "wide"), worker)
    ids = _read(conn, "wide")

    plans = nested_plans(conn, CLAIM, ("wide", ids, worker, "wide"))

    update = next(p for p in plans if "Update on step_tasks" in p)
    target = update[update.index("Update on step_tasks"):]
    assert "Tid Scan on step_tasks t" in target, update
    assert "idx_step_tasks_queued " not in update and "idx_step_tasks_flow_run_step" not in update, update
    assert not re.findall(r"Seq Scan on (runs|step_states|step_tasks)\b", "\n".join(plans))
    analyzed = conn.execute("SELECT count(*) FROM pg_stat_user_tables WHERE schemaname = 'pgflow' "
                            "AND (last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL)").fetchone()[0]
    assert analyzed == 0
    inputs = conn.execute("SELECT task_index, status FROM pgflow.step_tasks WHERE status = 'started' ORDER BY 1").fetchall()
    assert [i for i, _ in inputs] == list(range(80))


def _toast_fetches(conn: psycopg.Connection, table: str) -> int:
    """Rows of ``table``'s TOAST table this transaction has fetched so far (pg_stat_xact_all_tables)."""
    return conn.execute(
        "SELECT coalesce(s.idx_tup_fetch, 0) FROM pg_class AS c JOIN pg_stat_xact_all_tables AS s ON s.relid = c.reltoastrelid "
        "WHERE c.oid = %s::regclass", (table,)).fetchone()[0]


@pytest.mark.parametrize("kind", ["root", "dependent"])
def test_a_map_s_array_is_read_from_toast_once_per_claim_not_once_per_task(db, kind):
    """0012 read a root map's run input once per call already; a dependent map's dependency
    output it read (and detoasted) once per claimed task."""
    conn = db.connect()
    conn.execute("SELECT pgflow.create_flow('fan')")
    # distinct strings: too large to stay inline, so every read of the whole array goes to TOAST
    elements = [uuid.uuid4().hex * 2 for _ in range(2000)]
    if kind == "root":
        conn.execute("SELECT pgflow.add_step('fan', 'each', step_type => 'map')")
        worker = _worker(conn, "fan")
        run = conn.execute("SELECT run_id FROM pgflow.start_flow('fan', %s)", (Jsonb(elements),)).fetchone()[0]
        table, where = "pgflow.runs", ("SELECT pg_catalog.length(input::text) FROM pgflow.runs WHERE run_id = %s", (run,))
    else:
        conn.execute("SELECT pgflow.add_step('fan', 'list')")
        conn.execute("SELECT pgflow.add_step('fan', 'each', ARRAY['list'], step_type => 'map')")
        worker = _worker(conn, "fan")
        run = conn.execute("SELECT run_id FROM pgflow.start_flow('fan', '{}')").fetchone()[0]
        _claimed(conn, "fan", _read(conn, "fan"), worker)
        conn.execute("SELECT pgflow.complete_task(%s, 'list', 0, %s)", (run, Jsonb(elements)))
        table = "pgflow.step_states"
        where = ("SELECT pg_catalog.length(output::text) FROM pgflow.step_states WHERE run_id = %s AND step_slug = 'list'", (run,))
    ids = _read(conn, "fan")
    assert len(ids) == 10

    with conn.transaction():
        before = _toast_fetches(conn, table)
        conn.execute(*where).fetchone()
        one_read = _toast_fetches(conn, table) - before
        rows = _claimed(conn, "fan", ids, worker)
        claim_reads = _toast_fetches(conn, table) - before - one_read

    assert one_read > 1  # the array really is stored out of line, in several chunks
    assert claim_reads <= one_read, f"the claim fetched {claim_reads} TOAST rows; one read of the array takes {one_read}"
    assert {r[3]: r[4] for r in rows} == {i: elements[i] for i in range(10)}

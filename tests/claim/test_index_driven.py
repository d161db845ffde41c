"""Claims are driven by unique keys, whatever the table sizes and statistics (the queue stage, 0003).

With 100,000 finished runs in the tables and no statistics at all (autovacuum off, never analyzed,
``reltuples`` still -1), every statement a claim runs, its nested ones included (auto_explain,
plans sent to the client), reads the pgflow tables only through indexes: no sequential scan of
runs, step_states or step_tasks. The same right after a 10,000-item map started, and for the batch
report's run locks. The plan shape is asserted, never a time.
"""

from __future__ import annotations

import re
import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.claim.helpers import nested_plans as _plans

HISTORY = 100_000
BIG_TABLES = ("runs", "step_states", "step_tasks")


def _fill_history(conn: psycopg.Connection) -> None:
    """HISTORY completed runs of flow 'hist' (one step), written directly; no statistics anywhere."""
    for table in BIG_TABLES:
        conn.execute(f"ALTER TABLE pgflow.{table} SET (autovacuum_enabled = off)")
    conn.execute("SELECT pgflow.create_flow('hist')")
    conn.execute("SELECT pgflow.add_step('hist', 'only')")
    conn.execute("SELECT pgflow.create_flow('wide')")
    conn.execute("SELECT pgflow.add_step('wide', 'each', step_type => 'map')")
    conn.execute(
        """
        WITH made AS (
          INSERT INTO pgflow.runs (run_id, flow_slug, status, input, output, remaining_steps, completed_at)
          SELECT gen_random_uuid(), 'hist', 'completed', jsonb_build_object('i', i), '{}', 0, now()
          FROM generate_series(1, %(n)s) AS i
          RETURNING run_id
        ), states AS (
          INSERT INTO pgflow.step_states (flow_slug, run_id, step_slug, status, remaining_deps, remaining_tasks,
                                          initial_tasks, started_at, completed_at)
          SELECT 'hist', run_id, 'only', 'completed', 0, 0, 1, now(), now() FROM made
          RETURNING run_id
        )
        INSERT INTO pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, status, queue_name, message_id,
                                       attempts_count, started_at, completed_at)
        SELECT 'hist', run_id, 'only', 0, 'completed', 'hist', -row_number() OVER (), 1, now(), now() FROM states
        """,
        {"n": HISTORY},
    )
    stats = conn.execute(
        "SELECT c.relname, c.reltuples FROM pg_class c WHERE c.relnamespace = 'pgflow'::regnamespace "
        "AND c.relname = ANY (%s)", (list(BIG_TABLES),)).fetchall()
    assert all(tuples < 0 for _, tuples in stats), f"the tables must have no statistics yet: {stats}"


def _assert_index_driven(plans: list[str]) -> None:
    text = "\n".join(plans)
    scans = re.findall(r"Seq Scan on (\w+)", text)
    assert not [t for t in scans if t in BIG_TABLES], f"sequential scans of {sorted(set(scans))}:\n{text}"
    assert "step_tasks" in text and "Index" in text


@pytest.fixture
def history(db):
    conn = db.connect()
    _fill_history(conn)
    return conn


def _worker(conn: psycopg.Connection, flow: str) -> uuid.UUID:
    worker = uuid.uuid4()
    conn.execute("SELECT pgflow.register_worker(%s, 'test-worker', %s, %s)", (worker, flow, flow))
    return worker


CLAIM = "SELECT * FROM pgflow.claim_tasks(%s, %s::bigint[], %s, %s)"


def test_a_claim_next_to_100k_finished_runs_without_statistics_uses_indexes_only(history):
    worker = _worker(history, "hist")
    for i in range(12):
        history.execute("SELECT pgflow.start_flow('hist', %s)", (Jsonb({"live": i}),))
    ids = [r[0] for r in history.execute("SELECT msg_id FROM pgmq.read('hist', 30, 10)").fetchall()]
    # a finished task's late message and a duplicate too, so every branch's statements run
    late = history.execute("SELECT message_id FROM pgflow.step_tasks WHERE message_id < 0 LIMIT 1").fetchone()[0]
    plans = _plans(history, CLAIM, ("hist", ids + [late], worker, "hist"))
    _assert_index_driven(plans)
    outcomes = history.execute("SELECT status, count(*) FROM pgflow.step_tasks WHERE message_id > 0 GROUP BY 1").fetchall()
    assert dict(outcomes) == {"started": 10, "queued": 2}
    duplicate = _plans(history, CLAIM, ("hist", ids[:3], worker, "hist"))
    _assert_index_driven(duplicate)

    # the batch report locks its runs by key too
    claimed = history.execute("SELECT run_id FROM pgflow.step_tasks WHERE status = 'started'").fetchall()
    payload = [{"run_id": str(r[0]), "step_slug": "only", "task_index": 0, "output": None} for r in claimed]
    _assert_index_driven(_plans(history, "SELECT * FROM pgflow.complete_tasks(%s)", (Jsonb(payload),)))
    assert history.execute("SELECT count(*) FROM pgflow.runs WHERE status = 'completed'").fetchone()[0] == HISTORY + 10


def test_a_claim_right_after_a_10k_map_started_uses_indexes_only(history):
    worker = _worker(history, "wide")
    history.execute("SELECT pgflow.start_flow('wide', %s)", (Jsonb(list(range(10_000))),))
    ids = [r[0] for r in history.execute("SELECT msg_id FROM pgmq.read('wide', 30, 10)").fetchall()]
    plans = _plans(history, CLAIM, ("wide", ids, worker, "wide"))
    _assert_index_driven(plans)
    assert history.execute("SELECT count(*) FROM pgflow.step_tasks WHERE flow_slug = 'wide' AND status = 'started'"
                           ).fetchone()[0] == 10


def test_a_claim_on_small_analyzed_tables_still_uses_indexes_only(db):
    """1,000 queued tasks, ANALYZEd: the size where a cost-based plan prefers scanning (the runs lock,
    the task lock and the visibility change of main before 0012 scanned runs, step_tasks and the
    queue table here). Every row a claim locks, reads or hides is reached by key all the same."""
    conn = db.connect()
    conn.execute("SELECT pgflow.create_flow('small')")
    conn.execute("SELECT pgflow.add_step('small', 'only')")
    worker = _worker(conn, "small")
    conn.execute("SELECT count(*) FROM generate_series(1, 1000) AS i, "
                 "LATERAL pgflow.start_flow('small', jsonb_build_object('i', i))")
    conn.execute("ANALYZE")
    ids = [r[0] for r in conn.execute("SELECT msg_id FROM pgmq.read('small', 30, 10)").fetchall()]
    for batch in (ids, ids[:4]):  # claimed, then duplicates (deferred through the visibility helper)
        text = "\n".join(_plans(conn, CLAIM, ("small", batch, worker, "small")))
        scans = re.findall(r"Seq Scan on (\w+)", text)
        assert not [t for t in scans if t in BIG_TABLES or t == "q_small"], f"sequential scans of {sorted(set(scans))}:\n{text}"
        assert "Index Scan using q_small_pkey" in text
    assert conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE status = 'started' AND attempts_count = 1"
                        ).fetchone()[0] == 10


def test_the_claim_keeps_key_plans_once_its_plans_are_generic_without_statistics(db):
    """Right after a burst of 2,000 runs (no statistics), a session's claims switch to cached generic
    plans after five calls. Before 0012 the claim UPDATE's generic plan then found its tasks through
    idx_step_tasks_flow_run_step on the flow alone (every task of the flow read per claimed task);
    it must reach them by key like every other statement of the claim."""
    conn = db.connect()
    for table in BIG_TABLES:
        conn.execute(f"ALTER TABLE pgflow.{table} SET (autovacuum_enabled = off)")
    conn.execute("SELECT pgflow.create_flow('burst')")
    conn.execute("SELECT pgflow.add_step('burst', 'only')")
    worker = _worker(conn, "burst")
    conn.execute("SELECT count(*) FROM generate_series(1, 2000) AS i, "
                 "LATERAL pgflow.start_flow('burst', jsonb_build_object('i', i))")
    for _ in range(7):  # past PL/pgSQL's five custom plans
        ids = [r[0] for r in conn.execute("SELECT msg_id FROM pgmq.read('burst', 30, 10)").fetchall()]
        conn.execute(CLAIM, ("burst", ids, worker, "burst")).fetchall()
    ids = [r[0] for r in conn.execute("SELECT msg_id FROM pgmq.read('burst', 30, 10)").fetchall()]
    plans = _plans(conn, CLAIM, ("burst", ids, worker, "burst"))
    _assert_index_driven(plans)
    update = next(p for p in plans if "Update on step_tasks" in p)
    assert "idx_step_tasks_flow_run_step" not in update, update
    analyzed = conn.execute("SELECT count(*) FROM pg_stat_user_tables WHERE schemaname = 'pgflow' "
                            "AND (last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL)").fetchone()[0]
    assert analyzed == 0
    assert conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE status = 'started'").fetchone()[0] == 80

"""complete_tasks' set-based pass (0014) next to 100,000 finished runs without statistics: every
statement it runs, nested ones included, reaches runs, step_states and step_tasks by key (no
sequential scan), also where the claim tests do not look: the children it releases, the ready
steps it starts together (_start_ready_steps_of_runs), a map's output aggregated when its last
task completes, and the runs _advance_run moves on (docs/runtime.md "Batch reports": rows
addressed by their locked ctid, so no statement depends on the planner's estimates)."""

from __future__ import annotations

import pytest
from psycopg.types.json import Jsonb

from tests.claim.helpers import nested_plans
from tests.claim.test_index_driven import CLAIM, _assert_index_driven, _fill_history, _worker


@pytest.fixture
def history(db):
    conn = db.connect()
    _fill_history(conn)
    return conn


def _claim_all(conn, flow: str) -> list[dict]:
    worker = _worker(conn, flow)
    ids = [r[0] for r in conn.execute("SELECT msg_id FROM pgmq.read(%s, 30, 100)", (flow,)).fetchall()]
    rows = conn.execute(CLAIM, (flow, ids, worker, flow)).fetchall()
    assert rows and {r[0] for r in rows} == {"claimed"}
    return [{"run_id": str(r[4]), "step_slug": r[5], "task_index": r[6]} for r in rows]


def _batch_plans(conn, elements: list[dict], output) -> list[str]:
    return nested_plans(conn, "SELECT * FROM pgflow.complete_tasks(%s)", (Jsonb([dict(e, output=output) for e in elements]),))


def test_the_pass_releasing_children_and_starting_them_together_uses_indexes_only(history):
    history.execute("SELECT pgflow.create_flow('chain')")
    history.execute("SELECT pgflow.add_step('chain', 'a')")
    history.execute("SELECT pgflow.add_step('chain', 'b', ARRAY['a'])")
    history.execute("SELECT pgflow.add_step('chain', 'c', ARRAY['a'])")
    for i in range(10):
        history.execute("SELECT pgflow.start_flow('chain', %s)", (Jsonb({"i": i}),))
    plans = _batch_plans(history, list(reversed(_claim_all(history, "chain"))), {"x": 1})
    _assert_index_driven(plans)
    assert history.execute("SELECT count(*) FROM pgflow.step_tasks WHERE flow_slug = 'chain' AND status = 'queued'"
                           ).fetchone()[0] == 20
    last = _claim_all(history, "chain")
    one_per_run = list({e["run_id"]: e for e in last}.values())
    _assert_index_driven(_batch_plans(history, one_per_run, None))
    others = [e for e in last if e not in one_per_run]
    _assert_index_driven(_batch_plans(history, others, None))  # every run's last step: the runs complete
    assert history.execute("SELECT count(*) FROM pgflow.runs WHERE flow_slug = 'chain' AND status = 'completed'"
                           ).fetchone()[0] == 10


def test_the_pass_finishing_maps_and_moving_runs_on_uses_indexes_only(history):
    history.execute("SELECT pgflow.create_flow('maps')")
    history.execute("SELECT pgflow.add_step('maps', 'each', step_type => 'map')")
    history.execute("SELECT pgflow.add_step('maps', 'after', ARRAY['each'])")
    for i in range(8):
        history.execute("SELECT pgflow.start_flow('maps', %s)", (Jsonb([i, i + 1]),))
    claimed = _claim_all(history, "maps")
    firsts = [e for e in claimed if e["task_index"] == 0]
    seconds = [e for e in claimed if e["task_index"] == 1]
    _assert_index_driven(_batch_plans(history, firsts, "first"))
    _assert_index_driven(_batch_plans(history, list(reversed(seconds)), "second"))  # each map's last task
    outputs = history.execute("SELECT DISTINCT output FROM pgflow.step_states WHERE flow_slug = 'maps' "
                              "AND step_slug = 'each'").fetchall()
    assert outputs == [(["first", "second"],)]
    _assert_index_driven(_batch_plans(history, _claim_all(history, "maps"), "done"))
    assert history.execute("SELECT count(*) FROM pgflow.runs WHERE flow_slug = 'maps' AND status = 'completed'"
                           ).fetchone()[0] == 8

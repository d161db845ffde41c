"""The audit's plans stay linear in the number of flows (issue 18; timed in bench/benchmarks/audit.py).

Joins between CTEs, whose columns carry no statistics, are estimated at 1/200 selectivity; when
such estimates compound, the planner sizes hash tables for relations it believes are huge. At
10,000 flows the findings statement once planned a hash anti join with 1,048,576 batches for an
empty relation (17 s instead of under 1 s). The guard here is on the plan, not on time: no hash
table is planned for more than a few rows per flow.
"""

from __future__ import annotations

from typing import Any

from pgflow_cli import sqlfiles
from pgflow_cli.operations.audit import AUDIT_SQL

FLOWS = 2_000
STEPS_PER_FLOW = 3
ROWS_PER_FLOW = 5
"""The largest hash table the plans may expect, per flow (the fixed plans: under 1.5; before: 30)."""


def _hash_estimates(plan: dict[str, Any]) -> list[float]:
    rows = [plan["Plan Rows"]] if plan["Node Type"] == "Hash" else []
    for child in plan.get("Plans", []):
        rows += _hash_estimates(child)
    return rows


def test_no_hash_is_planned_for_more_than_a_few_rows_per_flow(baseline_db):
    conn = baseline_db.connect()
    with conn.transaction():
        # definitions and queue metadata only: the planner's estimates depend on row counts and
        # statistics, not on the queue tables existing (creating 2,000 queues would take a minute)
        conn.execute("INSERT INTO pgflow.flows (flow_slug) SELECT 'flow_' || g FROM generate_series(1, %s) AS g",
                     (FLOWS,))
        conn.execute("INSERT INTO pgflow.steps (flow_slug, step_slug, step_index) "
                     "SELECT 'flow_' || g, 'step_' || i, i FROM generate_series(1, %s) AS g, "
                     "generate_series(0, %s) AS i", (FLOWS, STEPS_PER_FLOW - 1))
        conn.execute("INSERT INTO pgmq.meta (queue_name, is_partitioned, is_unlogged) "
                     "SELECT 'flow_' || g, false, false FROM generate_series(1, %s) AS g", (FLOWS,))
    conn.execute("ANALYZE")

    for name in ("findings", "flow_impact"):
        (document,) = conn.execute("EXPLAIN (FORMAT JSON) " + sqlfiles.statement(AUDIT_SQL, name)).fetchone()
        largest = max(_hash_estimates(document[0]["Plan"]), default=0)
        assert largest <= ROWS_PER_FLOW * FLOWS, (name, largest)

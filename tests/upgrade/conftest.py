"""Fixtures of the upgrade tests: a pre-upgrade database holding runs in every state.

The pre-upgrade state is built only through the released-baseline runtime (migrations
0001-0002, protocol 1): worker startup compilation, start_flow, pgmq reads, start_tasks,
complete_task and fail_task, exactly as released workers would have left it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgflow_cli.worker import Flow, ProtocolV1

HANDLERS = {
    ("orderFlow", "validate"): lambda run, ctx: {"ok": True},
    ("orderFlow", "charge"): lambda deps, ctx: {"charged": 10},
    ("orderFlow", "ship"): lambda deps, ctx: {"parcel": "p"},
    ("fanOut", "list"): lambda run, ctx: [1, 2, 3, 4],
    ("fanOut", "process"): lambda item, ctx: item * 10,
    ("fanOut", "collect"): lambda deps, ctx: sum(deps["process"]),
    ("skipper", "risky"): lambda run, ctx: 1,
    ("skipper", "after"): lambda deps, ctx: {"done": True},
}
"""Deterministic handlers; before the upgrade the fixture drives tasks by hand with the same outputs."""


def flows(wrap: Callable[[str, str, Callable], Callable] | None = None) -> list[Flow]:
    """The flows of the upgrade fixture (camelCase slugs: their PGMQ meta rows are mixed case).

    ``wrap(flow_slug, step_slug, handler)`` may decorate every handler (e.g. to record calls).
    """
    def h(flow: str, step: str) -> Callable:
        handler = HANDLERS[(flow, step)]
        return wrap(flow, step, handler) if wrap else handler

    order = (
        Flow("orderFlow", base_delay=30)
        .step("validate", h("orderFlow", "validate"), max_attempts=1)
        .step("charge", h("orderFlow", "charge"), depends_on=["validate"], max_attempts=3)
        .step("ship", h("orderFlow", "ship"), depends_on=["charge"])
    )
    fan = (
        Flow("fanOut")
        .step("list", h("fanOut", "list"))
        .map("process", h("fanOut", "process"), array="list")
        .step("collect", h("fanOut", "collect"), depends_on=["process"])
    )
    skipper = (
        Flow("skipper")
        .step("risky", h("skipper", "risky"), max_attempts=1, when_exhausted="skip")
        .step("after", h("skipper", "after"), depends_on=["risky"])
    )
    return [order, fan, skipper]


@dataclass
class PreUpgrade:
    """What the fixture created: run ids by the state they were left in."""

    runs: dict[str, uuid.UUID] = field(default_factory=dict)
    old_worker: uuid.UUID = field(default_factory=uuid.uuid4)


class BaselineDriver:
    """Drives the released runtime by hand (protocol 1: the queue is the flow slug)."""

    def __init__(self, conn: psycopg.Connection, worker: uuid.UUID) -> None:
        self.conn = conn
        self.worker = worker

    def start(self, flow: str, run_input: Any) -> uuid.UUID:
        return self.conn.execute("SELECT run_id FROM pgflow.start_flow(%s, %s)", (flow, Jsonb(run_input))).fetchone()[0]

    def claim(self, flow: str, run_id: uuid.UUID, step: str, count: int | None = None) -> list[dict]:
        """Claim the visible queued tasks of one step of one run (at most ``count``)."""
        ids = [r[0] for r in self.conn.execute(
            "SELECT message_id FROM pgflow.step_tasks WHERE run_id = %s AND step_slug = %s AND status = 'queued' "
            "ORDER BY task_index", (run_id, step)).fetchall()]
        ids = ids[:count] if count is not None else ids
        # make them visible and read them, as a worker's poll would
        self.conn.execute("SELECT pgmq.set_vt(%s, %s::bigint[], 0)", (flow, ids))
        with self.conn.cursor(row_factory=dict_row) as cur:
            return cur.execute("SELECT * FROM pgflow.start_tasks(%s, %s, %s)", (flow, ids, self.worker)).fetchall()

    def complete(self, task: dict, output: Any) -> None:
        self.conn.execute("SELECT count(*) FROM pgflow.complete_task(%s, %s, %s, %s)",
                          (task["run_id"], task["step_slug"], task["task_index"], Jsonb(output)))

    def fail(self, task: dict, error: str = "boom") -> None:
        self.conn.execute("SELECT count(*) FROM pgflow.fail_task(%s, %s, %s, %s)",
                          (task["run_id"], task["step_slug"], task["task_index"], error))

    def finish(self, flow: str, run_id: uuid.UUID, step: str, output: Any) -> None:
        for task in self.claim(flow, run_id, step):
            self.complete(task, output)


def build_pre_upgrade(conninfo: str) -> PreUpgrade:
    """Create runs in every state on a baseline database (see the module docstring)."""
    state = PreUpgrade()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        protocol = ProtocolV1()
        for flow in flows():
            protocol.compile(conn, flow.slug, flow.shape(), None)
        protocol.register(conn, worker_id=str(state.old_worker), function_name="legacy-worker",
                          queue_name="orderFlow", flow_slug="orderFlow", step_slug=None)
        d = BaselineDriver(conn, state.old_worker)

        start_runs_in_every_state(d, state)

        run = state.runs["skipped"] = d.start("skipper", {})
        for task in d.claim("skipper", run, "risky"):
            d.fail(task, "flaky")  # when_exhausted skip: the step is skipped, 'after' runs
        d.finish("skipper", run, "after", {"done": True})
    return state


def bulk_finished_runs(conn: psycopg.Connection, runs: int) -> None:
    """Many finished runs of the fixture's orderFlow, loaded in bulk (foreign-key triggers off)."""
    conn.execute("SET session_replication_role = replica")
    conn.execute(
        """
        WITH r AS (
          INSERT INTO pgflow.runs (run_id, flow_slug, status, input, remaining_steps, started_at, completed_at)
          SELECT gen_random_uuid(), 'orderFlow', 'completed', '{}', 0, now() - interval '1 day', now()
          FROM generate_series(1, %(runs)s)
          RETURNING run_id
        ), s AS (
          INSERT INTO pgflow.step_states (flow_slug, run_id, step_slug, status, remaining_tasks, initial_tasks,
                                          created_at, started_at, completed_at)
          SELECT 'orderFlow', r.run_id, st, 'completed', 0, 1, now() - interval '1 day', now() - interval '1 day', now()
          FROM r, unnest(ARRAY['validate', 'charge', 'ship']) AS st
          RETURNING run_id, step_slug
        )
        INSERT INTO pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, message_id, status, attempts_count,
                                       queued_at, started_at, completed_at)
        SELECT 'orderFlow', s.run_id, s.step_slug, 0, 1000000 + row_number() OVER (), 'completed', 1,
               now() - interval '1 day', now() - interval '1 day', now()
        FROM s
        """,
        {"runs": runs},
    )
    conn.execute("SET session_replication_role = origin")
    conn.execute("ANALYZE pgflow.step_tasks")


@pytest.fixture
def pre_upgrade(baseline_db) -> tuple:
    """``(database, PreUpgrade)``: a baseline database with runs in every state."""
    return baseline_db, build_pre_upgrade(baseline_db.conninfo)


def start_runs_in_every_state(d: BaselineDriver, state: PreUpgrade) -> None:
    """Through a protocol-1 driver, leave runs of orderFlow/fanOut in every in-flight and finished
    state (completed, failed, queued, started by a vanished worker, retry pending, map half done),
    recorded in ``state.runs``. Shared by the upgrade and the upstream-adoption fixtures."""
    run = state.runs["completed"] = d.start("orderFlow", {"order": 1})
    d.finish("orderFlow", run, "validate", {"ok": True})
    d.finish("orderFlow", run, "charge", {"charged": 10})
    d.finish("orderFlow", run, "ship", {"parcel": "p1"})

    run = state.runs["failed"] = d.start("orderFlow", {"order": 2})
    for task in d.claim("orderFlow", run, "validate"):
        d.fail(task, "invalid order")  # max_attempts 1: the run fails

    state.runs["queued"] = d.start("orderFlow", {"order": 3})

    run = state.runs["started"] = d.start("orderFlow", {"order": 4})
    assert len(d.claim("orderFlow", run, "validate")) == 1  # claimed by a worker that then vanished

    run = state.runs["retry_pending"] = d.start("orderFlow", {"order": 5})
    d.finish("orderFlow", run, "validate", {"ok": True})
    for task in d.claim("orderFlow", run, "charge"):
        d.fail(task, "card service timed out")  # retried after 30 * 2**1 = 60 s

    run = state.runs["map_half_done"] = d.start("fanOut", {})
    d.finish("fanOut", run, "list", [1, 2, 3, 4])
    for task in d.claim("fanOut", run, "process", 2):
        d.complete(task, task["input"] * 10)
    assert len(d.claim("fanOut", run, "process", 1)) == 1  # one in flight, one still queued

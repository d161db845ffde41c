"""Shared pieces of the whole-flow deletion tests: a flow with runs in every state, the SQL calls,
and the check that nothing of a dropped flow is left."""

from __future__ import annotations

import uuid
from typing import Any

from tests.stage1.test_deletion import ARCHIVE_LOG  # noqa: F401  (re-exported: deletion must archive nothing)

TABLES = ("flows", "steps", "deps", "runs", "step_states", "step_tasks")


def drop(rt, slug: str, *, force: bool = False, conn=None) -> dict[str, Any]:
    """``pgflow.drop_flow(slug, force)`` on ``conn`` (default: the runtime's connection)."""
    row = (conn or rt.conn).execute("SELECT pgflow.drop_flow(%s, force => %s) AS r", (slug, force)).fetchone()
    return row["r"] if isinstance(row, dict) else row[0]


def plan_of(rt, slug: str) -> dict[str, Any]:
    return rt.val("SELECT pgflow.drop_flow_plan(%s)", (slug,))


def assert_gone(rt, flow: str, queues: list[str]) -> None:
    """No row of ``flow`` in any pgflow table, and no table or meta row of any of ``queues``."""
    for table in TABLES:
        assert rt.val(f"SELECT count(*) FROM pgflow.{table} WHERE flow_slug = %s", (flow,)) == 0, table
    for queue in queues:
        assert rt.val("SELECT count(*) FROM pgmq.meta WHERE lower(queue_name) = %s", (queue,)) == 0, queue
        assert rt.val("SELECT to_regclass(%s)", (f"pgmq.q_{queue}",)) is None, queue
        assert rt.val("SELECT to_regclass(%s)", (f"pgmq.a_{queue}",)) is None, queue


def build_every_state(rt, slug: str) -> dict[str, uuid.UUID]:
    """A plain flow ``a -> each (map) -> tail`` plus ``cond`` (after ``a``, never met: skipped), and
    runs in every state: completed, failed (a failed and a cancelled task), started with a queued
    task and steps still ``created`` (never started), started with a task in flight."""
    rt.flow(slug, [
        {"slug": "a"},
        {"slug": "each", "deps": ["a"], "step_type": "map"},
        {"slug": "tail", "deps": ["each"]},
        {"slug": "cond", "deps": ["a"], "required_input_pattern": {"a": "never"}, "when_unmet": "skip"},
    ], max_attempts=1, base_delay=0)
    outputs = {"a": [1, 2], "each": "x", "tail": "t"}
    done = rt.start(slug, {"n": 1})
    rt.drive(slug, lambda task: outputs[task["step_slug"]])
    assert rt.run(done)["status"] == "completed"

    failed = rt.start(slug, {"n": 2})
    rt.poll(slug)
    rt.complete(failed, "a", 0, [1, 2])
    assert len(rt.poll(slug)) == 2
    rt.fail(failed, "each", 0, "boom")
    assert rt.run(failed)["status"] == "failed"

    queued = rt.start(slug, {"n": 3})
    in_flight = rt.start(slug, {"n": 4})
    assert len(rt.claim(slug, [rt.task(in_flight, "a")["message_id"]])) == 1
    assert rt.statuses(queued) == {"a": "started", "each": "created", "tail": "created", "cond": "created"}
    return {"completed": done, "failed": failed, "queued": queued, "in_flight": in_flight}

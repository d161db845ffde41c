"""docs/claim-protocol.md: the operator SQL runs as written after a real fatal stop, and the
inspection queries show no message body."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "claim-protocol.md"
SECRET = "body-secret-" + uuid.uuid4().hex


def _sql_blocks() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", DOC.read_text(), re.S)


def test_the_documented_recovery_sql_works_after_a_fatal_stop(cl):
    cl.flow("orders", [{"slug": "charge"}])
    run = cl.start("orders", {"order": 1})
    worker = cl.worker("orders")
    ghost = uuid.uuid4()
    bad = [cl.send("orders", json.dumps({"flow_slug": "orders", "run_id": str(ghost), "step_slug": "charge",
                                         "task_index": 0, "note": SECRET})),
           cl.send("orders", {"flow_slug": "orders", "note": SECRET})]
    result = cl.claim("orders", cl.read("orders"), worker, "orders")
    assert result.ids("fatal") == bad

    blocks = [b.replace("41, 42", ", ".join(map(str, bad))) for b in _sql_blocks()]
    reason_sql, shape_sql, agreement_sql, archive_sql, resume_sql, queues_sql = (
        next(b for b in blocks if key in b)
        for key in ("paused_reason IS NOT NULL", "top_level_keys", "flow_matches", "pgmq.archive(",
                    "SET enabled = true", "SELECT DISTINCT queue_name"))

    [paused] = cl.rows(reason_sql)
    assert paused["function_name"] == "orders-worker"
    assert f"message {bad[0]} task_missing" in paused["paused_reason"]
    assert f"message {bad[1]} ambiguous_message" in paused["paused_reason"]

    shapes = cl.rows(shape_sql)
    assert [s["msg_id"] for s in shapes] == bad
    assert [s["top_level_keys"] for s in shapes] == [
        ["flow_slug", "note", "run_id", "step_slug", "task_index"], ["flow_slug", "note"]]
    agreement = cl.rows(agreement_sql)
    assert [(a["msg_id"], a["run_id"], a["named_run_status"]) for a in agreement] == [(m, None, None) for m in bad]
    for row in shapes + agreement:
        assert SECRET not in repr(row)

    cl.conn.execute(archive_sql)
    assert cl.archived("orders") == bad
    cl.conn.execute(resume_sql)
    fn = cl.function_row("orders-worker")
    assert (fn["enabled"], fn["paused_reason"], fn["paused_at"]) == (True, None, None)
    assert [q["queue_name"] for q in cl.rows(queues_sql)] == ["orders"]

    # the released task is claimed by a new worker with its first attempt
    again = cl.claim("orders", cl.read("orders"), cl.worker("orders"), "orders")
    assert [(r["outcome"], r["run_id"], r["task_index"]) for r in again.rows] == [("claimed", run, 0)]

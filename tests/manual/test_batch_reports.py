"""Batch worker reports (complete_tasks / fail_tasks, the queue stage) refuse a manual task exactly as
the single calls do (PF010, with the single call's hint), naming the element, and apply nothing of
the batch."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_cli.worker.flow import Flow


def _element(task: dict, value, key: str = "output") -> dict:
    return {"run_id": str(task["run_id"]), "step_slug": task["step_slug"], "task_index": task["task_index"], key: value}


def test_an_element_the_single_call_refuses_rolls_the_whole_batch_back(rt, author):
    author(Flow("mixed").step("work", lambda i, c: i).step("approve", manual=True, depends_on=["work"]))
    first, second = rt.start("mixed", {}), rt.start("mixed", {})
    tasks = {t["run_id"]: t for t in rt.poll("mixed")}
    rt.complete(first, "work", 0, "done")
    manual = rt.task(first, "approve")
    assert manual["execution_mode"] == "manual"
    payload = [_element(tasks[second], "ok"), _element(manual, "forged")]
    with pytest.raises(psycopg.Error, match=r"complete_tasks\(\): element 1: complete_task\(\): task .* is a manual task") as refused:
        rt.conn.execute("SELECT * FROM pgflow.complete_tasks(%s)", (Jsonb(payload),))
    assert refused.value.sqlstate == "PF010"  # the single call's SQLSTATE and hint
    assert refused.value.diag.message_hint and "complete_manual_task" in refused.value.diag.message_hint
    assert rt.task(second, "work")["status"] == "started"  # element 0 was not applied
    with pytest.raises(psycopg.Error, match=r"fail_tasks\(\): element 0: fail_task\(\)") as refused:
        rt.conn.execute("SELECT * FROM pgflow.fail_tasks(%s)", (Jsonb([_element(manual, "no", "error_message")]),))
    assert refused.value.sqlstate == "PF010"
    rt.conn.execute("SELECT pgflow.complete_manual_task(%s, 'approve', 0, '\"yes\"')", (first,))
    rt.complete(second, "work", 0, "done")
    rt.conn.execute("SELECT pgflow.complete_manual_task(%s, 'approve', 0, '\"yes\"')", (second,))

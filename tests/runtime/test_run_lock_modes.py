"""Which reports and claims of one run take turns on its row, shown with real connections.

A claim locks its runs FOR KEY SHARE; a completion that only counts its step down (a map task that
is not the step's last) locks the run FOR NO KEY UPDATE, and the two do not wait for each other. A
report that may end its step or the run, and every failure, locks the run FOR UPDATE before any
task row, so the claims of the run still take turns with it (docs/runtime.md "Lock order").

"Does not wait" is shown with ``lock_timeout``: the other connection holds its locks until the test
commits it, so a call that waited for them would fail with 55P03 however fast the machine is.
"""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.runtime.driver import wait_until_blocked

pytestmark = pytest.mark.upgraded_only(reason="the lock modes of claim_tasks and the protocol-2 reports (0003)")

NO_WAIT = "SET lock_timeout = '10s'"  # a guard only: the holder never lets go while the call runs


def _map_run(rt, slug: str, items: int):
    """A root map of ``items`` tasks, all claimed but the last: ``(run, msg ids by task_index)``."""
    rt.flow(slug, [{"slug": "each", "step_type": "map"}])
    run = rt.start(slug, list(range(items)))
    ids = {m["message"]["task_index"]: m["msg_id"] for m in rt.read(slug)}
    rt.claim(slug, [ids[i] for i in range(items - 1)])
    return run, ids


def _complete(conn: psycopg.Connection, batch: bool, run, step: str, index: int, output) -> list[tuple]:
    if batch:
        return conn.execute(
            "SELECT status FROM pgflow.complete_tasks(%s)",
            (Jsonb([{"run_id": str(run), "step_slug": step, "task_index": index, "output": output}]),)).fetchall()
    return conn.execute("SELECT status FROM pgflow.complete_task(%s, %s, %s, %s)", (run, step, index, Jsonb(output))).fetchall()


@pytest.mark.parametrize("batch", [False, True], ids=["complete_task", "complete_tasks"])
def test_a_claim_does_not_wait_for_a_completion_that_counts_its_map_down(rt, db, batch):
    run, ids = _map_run(rt, "countdown", 3)
    reporter = db.connect(autocommit=False)
    assert _complete(reporter, batch, run, "each", 0, "zero") == [("completed",)]  # open: its locks are held

    claimer = db.connect()
    claimer.execute(NO_WAIT)
    rows = rt.claim_outcomes("countdown", [ids[2]], conn=claimer)
    assert [(r["outcome"], r["task_index"]) for r in rows] == [("claimed", 2)]

    reporter.commit()
    assert rt.task(run, "each", 0)["status"] == "completed"
    assert rt.task(run, "each", 2)["status"] == "started"
    assert rt.steps(run)["each"]["remaining_tasks"] == 2


@pytest.mark.parametrize("batch", [False, True], ids=["complete_task", "complete_tasks"])
def test_a_completion_that_counts_its_map_down_does_not_wait_for_a_claim(rt, db, batch):
    run, ids = _map_run(rt, "countdown2", 3)
    claimer = db.connect(autocommit=False)
    rows = rt.claim_outcomes("countdown2", [ids[2]], conn=claimer)  # open: its locks are held
    assert [r["outcome"] for r in rows] == ["claimed"]

    reporter = db.connect()
    reporter.execute(NO_WAIT)
    assert _complete(reporter, batch, run, "each", 0, "zero") == [("completed",)]
    claimer.commit()
    assert rt.steps(run)["each"]["remaining_tasks"] == 2


def _in_thread(call):
    result: dict = {}

    def target():
        try:
            result["value"] = call()
        except Exception as exc:  # surfaced below
            result["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    return thread, result


@pytest.mark.parametrize("batch", [False, True], ids=["complete_task", "complete_tasks"])
def test_a_completion_that_ends_its_step_waits_for_a_claim_of_its_run(rt, db, batch):
    """Steps a and b run side by side; b's claim is in flight while a's only task completes (which
    ends step a and moves the run on): the completion waits for the claim, then applies."""
    rt.flow("endstep", [{"slug": "a"}, {"slug": "b"}, {"slug": "c", "deps": ["a", "b"]}])
    run = rt.start("endstep", {})
    msgs = {m["message"]["step_slug"]: m["msg_id"] for m in rt.read("endstep")}
    rt.claim("endstep", [msgs["a"]])
    claimer = db.connect(autocommit=False)
    assert [r["outcome"] for r in rt.claim_outcomes("endstep", [msgs["b"]], conn=claimer)] == ["claimed"]

    reporter = db.connect()
    thread, result = _in_thread(lambda: _complete(reporter, batch, run, "a", 0, {"a": 1}))
    blockers = wait_until_blocked(rt.conn, reporter.info.backend_pid)
    assert blockers == [claimer.info.backend_pid]
    claimer.commit()
    thread.join(30)
    assert not thread.is_alive() and "error" not in result, result
    assert result["value"] == [("completed",)]
    steps = rt.steps(run)
    assert (steps["a"]["status"], steps["b"]["status"], steps["c"]["remaining_deps"]) == ("completed", "started", 1)


def test_a_failure_waits_for_a_claim_of_its_run(rt, db):
    """A failure can change the run's other tasks, so it takes turns with claims even with
    attempts left (the lock is taken before the outcome is known)."""
    run, ids = _map_run(rt, "failturn", 3)
    claimer = db.connect(autocommit=False)
    assert [r["outcome"] for r in rt.claim_outcomes("failturn", [ids[2]], conn=claimer)] == ["claimed"]

    reporter = db.connect()
    thread, result = _in_thread(
        lambda: reporter.execute("SELECT status FROM pgflow.fail_task(%s, 'each', 0, 'boom')", (run,)).fetchall())
    assert wait_until_blocked(rt.conn, reporter.info.backend_pid) == [claimer.info.backend_pid]
    claimer.commit()
    thread.join(30)
    assert not thread.is_alive() and "error" not in result, result
    assert result["value"] == [("queued",)]


def test_a_claim_waits_for_the_task_a_counting_completion_holds(rt, db):
    """A duplicate message of a task being reported: the claim waits for that task's row (not the
    run's), and then sees the report's result; the other task of its batch is claimed."""
    run, ids = _map_run(rt, "duptask", 3)
    reporter = db.connect(autocommit=False)
    assert _complete(reporter, False, run, "each", 1, "one") == [("completed",)]

    claimer = db.connect()
    other = uuid.uuid4()
    rt.conn.execute("SELECT pgflow.register_worker(%s, 'w-dup', %s, 'duptask')", (other, rt.queue("duptask")))
    thread, result = _in_thread(lambda: rt.claim_outcomes("duptask", [ids[1], ids[2]], other, conn=claimer))
    assert wait_until_blocked(rt.conn, claimer.info.backend_pid) == [reporter.info.backend_pid]
    reporter.commit()
    thread.join(30)
    assert not thread.is_alive() and "error" not in result, result
    assert [(r["outcome"], r["reason"], r["task_index"]) for r in result["value"]] == [
        ("missing", "message_gone_task_exists", 1), ("claimed", None, 2)]
    assert rt.task(run, "each", 2)["last_worker_id"] == other

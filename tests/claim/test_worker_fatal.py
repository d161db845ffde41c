"""The reference worker (pgflow_cli.worker.Worker, protocol 2) meeting unexpected work.

Fatal work: one ERROR log line naming queue and message id (never the body), the worker stops by
itself, marks itself stopped, claims nothing; the message stays visible, the function disabled,
and a restarted worker of the same function is refused at registration.
Foreign work: archived with a WARNING, and the worker keeps processing real work.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid

import pytest

from pgflow_cli.worker import Flow, Worker, WorkerFenced, WorkerOptions
from tests.claim.helpers import assert_no_body
from tests.worker.helpers import stop_and_join, wait_until

DEADLINE = 90.0  # hang guard only
SECRET = "body-secret-" + uuid.uuid4().hex
FAST = {"max_poll_seconds": 1, "poll_interval_ms": 20, "heartbeat_interval": 0.3, "drain_timeout": 30.0}


class Calls:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[str, str, int]] = []

    def handler(self, value, ctx):
        with self.lock:
            self.items.append((ctx.run_id, ctx.step_slug, ctx.task_index))
        return {"seen": value}


def _flow(calls: Calls) -> Flow:
    return Flow("guardedFlow", max_attempts=2, base_delay=0).step("a", calls.handler)


@pytest.fixture
def env(db, cl):
    workers: list[Worker] = []

    def make(calls: Calls, function: str = "guarded-fn") -> Worker:
        worker = Worker(_flow(calls), db.conninfo, function_name=function,
                        options=WorkerOptions(application_name="claim-test", **FAST))
        workers.append(worker)
        return worker

    yield make
    stop_and_join(workers, DEADLINE)


def _records(caplog, level):
    return [r for r in caplog.records if r.name == "pgflow.worker" and r.levelno == level]


def test_fatal_work_stops_the_worker_after_one_error_and_keeps_everything(cl, env, caplog):
    caplog.set_level(logging.INFO, logger="pgflow.worker")
    calls = Calls()
    # Compile the flow (a first worker start), so a real task can wait in the queue together
    # with the fatal message: both arrive in the worker's first batch.
    setup = env(calls, function="setup-fn")
    setup.start()
    setup.stop()
    assert setup.join(DEADLINE)
    run = cl.start("guardedFlow", {"x": 1})
    ghost = uuid.uuid4()
    bad = cl.send("guardedflow", json.dumps({"flow_slug": "guardedFlow", "run_id": str(ghost), "step_slug": "a",
                                             "task_index": 0, "note": SECRET}))
    caplog.clear()

    worker = env(calls)
    worker.start()
    assert worker.join(DEADLINE), "the worker did not stop by itself after the fatal claim"

    assert worker.state == "stopped"
    assert worker.stop_reason == "fatal claim outcome"
    assert worker.fatal and f"message {bad}: task_missing" in worker.fatal
    errors = _records(caplog, logging.ERROR)
    assert len(errors) == 1, [r.getMessage() for r in errors]
    text = errors[0].getMessage()
    assert "guardedflow" in text and str(bad) in text
    assert_no_body([r.getMessage() for r in caplog.records], [SECRET, str(ghost)])
    # nothing claimed, no handler ran
    assert worker.stats.snapshot()["claimed"] == 0
    assert calls.items == []
    task = cl.task(run, "a")
    assert (task["status"], task["attempts_count"], task["last_worker_id"]) == ("queued", 0, None)
    # the batch is visible again, nothing archived
    assert cl.visible_now("guardedflow", [bad, task["message_id"]]) == {bad: True, task["message_id"]: True}
    assert cl.archived("guardedflow") == []
    # the worker marked itself stopped; the database deprecated it and paused its function
    row = cl.worker_row(uuid.UUID(worker.worker_id))
    assert row["stopped_at"] is not None and row["deprecated_at"] is not None
    fn = cl.function_row("guarded-fn")
    assert fn["enabled"] is False and f"message {bad} task_missing" in fn["paused_reason"]
    assert_no_body([fn["paused_reason"]], [SECRET, str(ghost)])

    # a restarted worker of the same function is refused before it registers or polls
    restarted = env(calls)
    with pytest.raises(WorkerFenced):
        restarted.start()
    assert restarted.state == "stopped"
    assert cl.worker_row(uuid.UUID(restarted.worker_id)) is None
    assert cl.visible_now("guardedflow", [bad]) == {bad: True}
    assert cl.one("SELECT read_ct FROM pgmq.q_guardedflow WHERE msg_id = %s", (bad,))["read_ct"] == 1

    # resume: remove the message, enable the function; a new worker finishes the run
    cl.conn.execute("SELECT pgmq.archive('guardedflow', %s::bigint)", (bad,))
    cl.conn.execute("UPDATE pgflow.worker_functions SET enabled = true WHERE function_name = 'guarded-fn'")
    resumed = env(calls)
    resumed.start()
    wait_until(lambda: cl.one("SELECT status FROM pgflow.runs WHERE run_id = %s", (run,))["status"] == "completed",
          "the run to complete after the resume")
    record_claims(cl, run)
    assert calls.items == [(str(run), "a", 0)]


def test_a_foreign_message_is_archived_with_a_warning_and_work_goes_on(cl, env, caplog):
    caplog.set_level(logging.INFO, logger="pgflow.worker")
    calls = Calls()
    worker = env(calls)
    worker.start()
    foreign = cl.send("guardedflow", {"hello": "world", "note": SECRET})
    wait_until(lambda: cl.archived("guardedflow") == [foreign], "the foreign message to be archived")
    runs = [cl.start("guardedFlow", {"n": n}) for n in range(3)]
    wait_until(lambda: cl.val("SELECT count(*) FROM pgflow.runs WHERE run_id = ANY(%s) AND status = 'completed'",
                         (runs,)) == 3, "the runs to complete")

    assert worker.state == "running" and worker.fatal is None
    warnings = [r.getMessage() for r in _records(caplog, logging.WARNING)]
    assert [w for w in warnings if "foreign" in w and str(foreign) in w and "guardedflow" in w]
    assert _records(caplog, logging.ERROR) == []
    assert_no_body([r.getMessage() for r in caplog.records], [SECRET])
    assert cl.function_row("guarded-fn")["enabled"] is True
    assert sorted(calls.items) == sorted((str(r), "a", 0) for r in runs)
    for run in runs:
        record_claims(cl, run)


def record_claims(cl, run) -> None:
    """Tasks the reference worker claimed count in the claim ledger (checked after the test):
    each completed task must have been claimed exactly once."""
    for task in cl.tasks(run):
        assert (task["status"], task["attempts_count"]) == ("completed", 1)
        cl.ledger[(task["run_id"], task["step_slug"], task["task_index"])] += 1

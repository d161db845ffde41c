"""Failures an operator can read, on a real server: a failure that will be retried is a WARNING
(attempt k/n, in how long, the exception's type and message), the last one an ERROR; tracebacks
are logged and stored on request; an output that cannot be stored is logged; the stop summary is
one line. And what a handler's RetryLater / FailNow do: the database defers the next attempt or
ends the task now; a database whose fail_task does not take them gets an ordinary failure."""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid

from pgflow_cli.worker import FailNow, Flow, RetryLater
from pgflow_cli.worker.failures import TaskFailure
from pgflow_cli.worker.protocol import LATEST, ProtocolV2
from tests.worker.helpers import wait_until


def _failure_records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == "task_failed"]


def explode(value, ctx):
    raise ValueError(f"bad row {ctx.attempt}")


def test_a_retried_failure_warns_and_the_last_one_is_an_error(env, caplog):
    caplog.set_level(logging.INFO, logger="pgflow.worker")
    env.start_worker(Flow("logFlow", max_attempts=3, base_delay=1).step("parse", explode))
    run_id = env.start_run("logFlow", {})
    [run] = env.wait_runs_finished([run_id])
    assert run["status"] == "failed"

    records = _failure_records(caplog)
    assert [(r.levelname, r.attempt, r.max_attempts, r.retry_in_seconds) for r in records] == [
        ("WARNING", 1, 3, 2.0), ("WARNING", 2, 3, 4.0), ("ERROR", 3, 3, None)]
    first, _, last = (r.getMessage() for r in records)
    assert first.startswith("task failed (attempt 1/3), retried in 2s: flow=logFlow step=parse run=")
    assert first.endswith(": ValueError: bad row 1")
    assert last.startswith("task failed on its last attempt (3/3); the step's when_exhausted=fail applies:")
    assert last.endswith(": ValueError: bad row 3")
    assert all(r.exc_info is None for r in records)  # tracebacks only on request
    assert {(r.flow, r.step, r.run_id, r.error_type, r.when_exhausted) for r in records} == {
        ("logFlow", "parse", run_id, "ValueError", "fail")}
    assert env.task(run_id, "parse")["error_message"] == "ValueError: bad row 3"


def test_tracebacks_are_logged_and_stored_on_request(env, caplog):
    caplog.set_level(logging.INFO, logger="pgflow.worker")
    env.start_worker(Flow("traceFlow", max_attempts=1).step("parse", explode),
                     log_tracebacks=True, store_tracebacks=True)
    run_id = env.start_run("traceFlow", {})
    env.wait_runs_finished([run_id])

    [record] = _failure_records(caplog)
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    stored = env.task(run_id, "parse")["error_message"]
    summary, _, trace = stored.partition("\n\n")
    assert summary == "ValueError: bad row 1"
    assert trace.startswith("Traceback (most recent call last):") and ", in explode\n" in trace
    assert trace.rstrip().endswith("ValueError: bad row 1")


def test_outputs_that_cannot_be_stored_are_logged_and_fail_readably(env, caplog):
    caplog.set_level(logging.INFO, logger="pgflow.worker")
    flow = (Flow("outputFlow", max_attempts=1)
            .step("a_set", lambda v, ctx: {1, 2}, when_exhausted="skip")
            .step("nul_text", lambda v, ctx: {"text": "a\x00b"}, when_exhausted="skip"))
    env.start_worker(flow, max_concurrent=2)
    run_id = env.start_run("outputFlow", {})
    env.wait_runs_finished([run_id])

    by_step = {r.step: r for r in _failure_records(caplog)}
    assert by_step["a_set"].error_type == "UnstorableOutput" and by_step["a_set"].levelname == "ERROR"
    assert "handler output cannot be stored: Object of type set is not JSON serializable" in by_step["a_set"].getMessage()
    assert env.task(run_id, "a_set")["error_message"] == (
        "handler output cannot be stored: Object of type set is not JSON serializable")
    assert "NUL character" in by_step["nul_text"].getMessage()
    assert "NUL character" in env.task(run_id, "nul_text")["error_message"]


def test_the_stop_summary_is_one_readable_line(env, caplog):
    caplog.set_level(logging.INFO, logger="pgflow.worker")
    flow = (Flow("summaryFlow", max_attempts=1)
            .step("ok", lambda v, ctx: 1)
            # after "ok": a failure first would fail the run and its sibling's result would be refused
            .step("bad", explode, depends_on=["ok"]))
    worker = env.start_worker(flow, max_concurrent=2)
    env.wait_runs_finished([env.start_run("summaryFlow", {})])
    wait_until(lambda: worker.stats.snapshot()["completed"] + worker.stats.snapshot()["failed"] == 2, "both reports")
    worker.stop()
    assert worker.join(60)
    [line] = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "worker_stopped"]
    assert re.fullmatch(rf"worker {worker.worker_id} stopped \(stop requested\) after \d+\.\ds: 2 claimed, "
                        r"1 completed, 1 failed, 0 left to stalled-task recovery", line), line


# ----------------------------------------------------------------------------------------------
# RetryLater and FailNow
# ----------------------------------------------------------------------------------------------
class Calls:
    """When each call of a handler began (monotonic seconds), per task index; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.at: dict[int, list[float]] = {}

    def add(self, ctx) -> int:
        with self.lock:
            self.at.setdefault(ctx.task_index, []).append(time.monotonic())
            return len(self.at[ctx.task_index])


class _WithoutRetryControl(ProtocolV2):
    """Protocol 2 on a database whose fail_task has no retry delay or fail-now (as its probe would
    find on a schema without them)."""

    def has_retry_control(self, conn) -> bool:
        return False


def test_directives_are_ordinary_failures_with_their_text_where_the_database_does_not_take_them(env, caplog):
    """The four released arguments are sent, the step's backoff and attempts apply, and the log says so."""
    caplog.set_level(logging.INFO, logger="pgflow.worker")

    def steer(item, ctx):
        if item == "retry":
            raise RetryLater(30, "provider busy")
        raise FailNow("the source is gone")

    env.start_worker(Flow("steerFlow", max_attempts=2, base_delay=0).map("each", steer), max_concurrent=2,
                     protocol=_WithoutRetryControl())
    # one run per directive: in one run, the first task to exhaust its attempts fails the run, and
    # its sibling's second attempt may then never be claimed
    retry_run, fail_run = env.start_runs("steerFlow", [["retry"], ["fail"]])
    env.wait_runs_finished([retry_run, fail_run])
    [retried] = env.tasks(retry_run, "each")
    [failed] = env.tasks(fail_run, "each")
    assert (retried["attempts_count"], retried["error_message"]) == (2, "RetryLater: provider busy")
    assert (failed["attempts_count"], failed["error_message"]) == (2, "FailNow: the source is gone")
    notes = {r.getMessage().rsplit("(", 1)[-1] for r in _failure_records(caplog) if r.attempt == 1}
    assert notes == {"asked to retry in 30s: this database does not support that yet, an ordinary failure)",
                     "asked to fail now: this database does not support that yet, an ordinary failure)"}


def test_a_directive_on_the_last_attempt_fails_the_task_normally(env):
    def wait_long(value, ctx):
        raise RetryLater(300, "would wait")

    env.start_worker(Flow("lastSteerFlow", max_attempts=1).step("only", wait_long))
    run_id = env.start_run("lastSteerFlow", {})
    [run] = env.wait_runs_finished([run_id])
    task = env.task(run_id, "only")
    assert (run["status"], task["status"], task["attempts_count"]) == ("failed", "failed", 1)


def test_retry_later_delays_the_next_attempt_instead_of_the_backoff(env):
    calls = Calls()

    def later(value, ctx):
        if calls.add(ctx) == 1:
            raise RetryLater(3)
        return "second"

    env.start_worker(Flow("retryLaterFlow", max_attempts=3, base_delay=0).step("only", later))
    run_id = env.start_run("retryLaterFlow", {})
    [run] = env.wait_runs_finished([run_id])
    assert run["status"] == "completed" and env.task(run_id, "only")["attempts_count"] == 2
    first, second = calls.at[0]
    assert second - first >= 3 - 0.5  # whole-second visibility; the backoff (base 0) would retry at once


def test_fail_now_on_a_map_task_ends_it_at_once_and_the_steps_when_exhausted_applies(env):
    def gone(item, ctx):
        if item == "gone":
            raise FailNow("source missing")
        return item

    flow = (Flow("failNowFlow", max_attempts=3, base_delay=0)
            .map("each", gone, when_exhausted="skip")
            .step("after", lambda deps, ctx: sorted(deps), depends_on=["each"]))
    env.start_worker(flow)
    run_id = env.start_run("failNowFlow", ["a", "gone", "b"])
    [run] = env.wait_runs_finished([run_id])
    failed = env.task(run_id, "each", 1)
    assert (failed["status"], failed["attempts_count"]) == ("failed", 1)
    assert env.steps(run_id)["each"]["status"] == "skipped" and run["status"] == "completed"


def _failure(exc: BaseException) -> TaskFailure:
    try:
        raise exc
    except BaseException as raised:
        return TaskFailure.from_exception(raised)


def test_fail_tasks_applies_mixed_directives_element_by_element(env):
    """One fail_tasks call (the worker's batch path, through the one element builder) with a
    retry delay, a fail-now and a plain failure. The fail-now is of another run: it skips its map
    step (when_exhausted=skip), which would skip the other two with it."""
    flow = Flow("mixedSteerFlow", max_attempts=3, base_delay=0).map("each", lambda item, ctx: item,
                                                                    when_exhausted="skip")
    env.worker(flow).start()
    env.stop_workers()
    run_id = env.start_run("mixedSteerFlow", ["later", "plain"])
    other_run = env.start_run("mixedSteerFlow", ["now"])
    conn = env.db.connect()  # tuple rows, as the worker's pool gives them
    protocol = LATEST()
    queue = protocol.queue_name("mixedSteerFlow", None)
    worker_id = str(uuid.uuid4())
    protocol.register(conn, worker_id=worker_id, function_name="mixed-fn", queue_name=queue,
                      flow_slug="mixedSteerFlow", step_slug=None)
    ids = protocol.read(conn, queue_name=queue, vt=30, qty=3, max_poll_seconds=1, poll_interval_ms=20)
    claimed = {(t.run_id, t.task_index): t for t in protocol.claim(
        conn, flow_slug="mixedSteerFlow", step_slug=None, queue_name=queue, message_ids=ids, worker_id=worker_id).claimed}
    assert len(claimed) == 3
    protocol.fail_many(conn, [(claimed[(run_id, 0)], _failure(RetryLater(30))),
                              (claimed[(other_run, 0)], _failure(FailNow("no"))),
                              (claimed[(run_id, 1)], _failure(RuntimeError("plain")))])

    later, plain, now = env.task(run_id, "each", 0), env.task(run_id, "each", 1), env.task(other_run, "each", 0)
    assert (now["status"], now["attempts_count"], now["failed_now"]) == ("failed", 1, True)
    assert env.steps(other_run)["each"]["status"] == "skipped"
    assert (later["status"], later["requested_retry_delay"], plain["status"]) == ("queued", 30, "queued")
    visible_in = {t["task_index"]: env.val(f"SELECT extract(epoch FROM vt - now()) FROM pgmq.q_{queue} WHERE msg_id = %s",
                                           (t["message_id"],)) for t in (later, plain)}
    assert visible_in[0] > 20 and visible_in[1] < 5  # the override for one element, the backoff for the other

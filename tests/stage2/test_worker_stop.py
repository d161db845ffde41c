"""`pgflow worker` as a real process: a second Ctrl-C stops now (exit 130) and says what it leaves
to stalled-task recovery, with a ``def`` handler that never returns and with an ``async def``
handler (cancelled cleanly); ``--log-format json`` with tracebacks logged and stored."""

from __future__ import annotations

import json
import re
import signal

import jsonschema
import pytest

from tests.stage2.helpers import CliWorker, flow_target
from tests.support.schemas import validate
from tests.worker.helpers import wait_until


def _status(conn, sql: str, *args):
    return conn.execute(sql, args).fetchone()[0]


@pytest.mark.parametrize(("flow", "slug"), [("blocking", "cliBlocking"), ("async_blocking", "cliAsyncBlocking")],
                         ids=["def-handler", "async-handler"])
def test_a_second_ctrl_c_stops_now_and_leaves_the_running_task_to_stalled_recovery(db, tmp_path, flow, slug):
    conn = db.connect()
    never = tmp_path / "never-released"
    proc = CliWorker.start(db.conninfo, flow_target(flow), "--drain-timeout", "600",
                           env={"PGFLOW_TEST_RELEASE": str(never)})
    try:
        worker_id = proc.wait_started()
        run_id = _status(conn, "SELECT run_id FROM pgflow.start_flow(%s, '{}')", slug)
        proc.wait_for_line(f"HOLDING {run_id}")
        proc.signal(signal.SIGINT)
        proc.wait_for_line("received SIGINT: draining 1 in-flight task(s)", which="stderr")
        assert proc.popen.poll() is None, "the first Ctrl-C drains: the worker waits for its handler"
        proc.signal(signal.SIGINT)
        assert proc.wait_exit() == 130  # although the handler never returns by itself

        stderr = "\n".join(proc.lines("stderr"))
        assert "received SIGINT again: stopping now; 1 task(s) still in flight stay started and stalled-task " \
               "recovery requeues each one once its step timeout + 30 s have passed since its claim" in stderr
        summary = [line for line in proc.lines("stderr") if f"worker {worker_id} stopped (" in line]
        assert len(summary) == 1 and "stopped (signal SIGINT, then second SIGINT) after" in summary[0]
        left = "0 left to stalled-task recovery; 1 cancelled" if flow == "async_blocking" \
            else "1 left to stalled-task recovery"
        assert left in summary[0], summary[0]
        if flow == "async_blocking":
            assert f"CANCELLED {run_id}" in proc.lines()  # the coroutine saw its cancellation
        assert "Traceback" not in stderr
        task = conn.execute("SELECT status, attempts_count FROM pgflow.step_tasks WHERE run_id = %s",
                            (run_id,)).fetchone()
        assert task == ("started", 1)
        assert _status(conn, "SELECT stopped_at IS NOT NULL FROM pgflow.workers WHERE worker_id = %s", worker_id)
    finally:
        proc.kill()


def test_json_logs_with_tracebacks_logged_and_stored(db):
    conn = db.connect()
    proc = CliWorker.start(db.conninfo, flow_target("failing"), "--log-format", "json", "--log-tracebacks",
                           "--store-tracebacks")
    try:
        proc.wait_started()
        run_id = _status(conn, "SELECT run_id FROM pgflow.start_flow('cliFailing', '{}')")
        wait_until(lambda: _status(conn, "SELECT status FROM pgflow.runs WHERE run_id = %s", run_id) == "failed",
                   "the run to fail")
        wait_until(lambda: any('"event": "task_failed"' in line and '"ERROR"' in line for line in proc.lines("stderr")),
                   "the last failure's log line")
        proc.signal(signal.SIGTERM)
        assert proc.wait_exit() == 0
    finally:
        proc.kill()

    records = [json.loads(line) for line in proc.lines("stderr")]  # every line is one JSON object
    for record in records:
        validate(record, "worker-log")
    with pytest.raises(jsonschema.ValidationError):
        validate({**records[0], "attempt": 0}, "worker-log")
    failures = [r for r in records if r.get("event") == "task_failed"]
    assert [(r["level"], r["attempt"], r["max_attempts"], r["retry_in_seconds"]) for r in failures] == [
        ("WARNING", 1, 2, 0), ("ERROR", 2, 2, None)]
    assert all(r["run_id"] == str(run_id) and r["flow"] == "cliFailing" and r["step"] == "parse" for r in failures)
    assert failures[1]["error"] == "ValueError: row 2 is bad"
    assert "in fail_each_time" in failures[1]["traceback"]
    [stopped] = [r for r in records if r.get("event") == "worker_stopped"]
    assert re.search(r"stopped \(signal SIGTERM\) after .*: 2 claimed, 0 completed, 2 failed, 0 left", stopped["message"])
    stored = _status(conn, "SELECT error_message FROM pgflow.step_tasks WHERE run_id = %s", run_id)
    assert stored.startswith("ValueError: row 2 is bad\n\nTraceback (most recent call last):")

"""`pgflow task list|show|complete|fail`: JSON documents, --older-than, exit codes, no task data printed."""

from __future__ import annotations

import json

import pytest

from pgflow_cli.cli.common import parse_duration
from pgflow_cli.errors import UsageError
from pgflow_cli.worker.flow import Flow
from tests.support.cli import run_cli


@pytest.fixture
def waiting(rt, author):
    """Two runs of a flow whose manual step waits; the first has waited two hours."""
    author(Flow("review").step("approve", manual=True).step("ship", lambda i, c: i, depends_on=["approve"]))
    old, new = rt.start("review", {"secret": "s3cr3t-input"}), rt.start("review", {})
    rt.conn.execute("UPDATE pgflow.step_tasks SET started_at = started_at - interval '2 hours', "
                    "queued_at = queued_at - interval '2 hours' WHERE run_id = %s", (old,))
    return str(old), str(new)


def task_cli(db, *args):
    return run_cli("task", *args, "--dsn", db.conninfo)


def test_list_shows_waiting_tasks_oldest_first_with_age_and_older_than(db, waiting):
    old, new = waiting
    listed = task_cli(db, "list", "--format", "json")
    assert listed.code == 0, listed.output
    document = json.loads(listed.stdout)
    assert (document["kind"], document["version"]) == ("pgflow-cli/manual-tasks", 1)
    assert [(t["run_id"], t["step_slug"], t["task_index"], t["waiting"]) for t in document["tasks"]] == [
        (old, "approve", 0, True), (new, "approve", 0, True)]
    assert document["tasks"][0]["age_seconds"] >= 7200
    overdue = json.loads(task_cli(db, "list", "--older-than", "1h", "--format", "json").stdout)
    assert [t["run_id"] for t in overdue["tasks"]] == [old]
    table = task_cli(db, "list")
    assert table.code == 0 and "2h 0m" in table.stdout and old in table.stdout
    assert "s3cr3t" not in listed.output + table.output


def test_complete_then_repeat_then_conflict(db, waiting, rt):
    old, _ = waiting
    done = task_cli(db, "complete", old, "approve", "--output", '{"ok": true}', "--format", "json")
    assert done.code == 0, done.output
    [task] = json.loads(done.stdout)["tasks"]
    assert (task["status"], task["run_status"], task["step_status"]) == ("completed", "started", "completed")
    assert rt.task(old, "ship")["status"] == "queued"
    again = task_cli(db, "complete", old, "approve", "--output", '{"ok": true}')
    assert again.code == 0, again.output
    conflict = task_cli(db, "complete", old, "approve", "--output", '{"ok": false}', "--format", "json")
    assert conflict.code == 6
    error = json.loads(conflict.stderr)
    assert error["error"] == "ManualTaskConflict" and "different output" in error["message"]
    assert task_cli(db, "fail", old, "approve", "--error", "no").code == 6
    assert len(rt.tasks(old, "ship")) == 1


def test_fail_show_and_refusals(db, waiting, rt):
    _, new = waiting
    failed = task_cli(db, "fail", new, "approve", "--error", "rejected", "--format", "json")
    assert failed.code == 0, failed.output
    assert json.loads(failed.stdout)["tasks"][0]["run_status"] == "failed"
    shown = json.loads(task_cli(db, "show", new, "approve", "--format", "json").stdout)["tasks"][0]
    assert (shown["status"], shown["error_message"], shown["waiting"]) == ("failed", "rejected", False)

    assert task_cli(db, "show", new, "approve", "--index", "3").code == 6  # not found
    assert task_cli(db, "show", new, "ship").code == 6  # no task yet (step never started)
    assert task_cli(db, "complete", "not-a-uuid", "approve", "--output", "1").code == 2
    assert task_cli(db, "complete", new, "approve", "--output", "{broken").code == 2
    assert task_cli(db, "complete", new, "approve").code == 2  # no output given
    assert task_cli(db, "fail", new, "approve").code == 2  # no error message
    assert task_cli(db, "list", "--older-than", "soon").code == 2


def test_a_queue_backed_task_is_not_manual(db, rt, author):
    author(Flow("plain").step("work", lambda i, c: i))
    run = str(rt.start("plain", {}))
    shown = task_cli(db, "show", run, "work")
    assert shown.code == 6 and "queue-backed" in shown.stderr
    assert task_cli(db, "complete", run, "work", "--output", "1").code == 6


def test_parse_duration():
    assert [parse_duration(t, "--older-than") for t in ("90", "90s", "15m", "2h", "1d", "1.5h")] == \
        [90, 90, 900, 7200, 86400, 5400]
    with pytest.raises(UsageError, match="--stale-for '-5m' is not a duration"):
        parse_duration("-5m", "--stale-for")

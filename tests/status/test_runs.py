"""`pgflow runs list` and `pgflow runs show` on the demo seed (baseline level) and the latest level."""

from __future__ import annotations

import json

import pytest

from pgflow_cli.errors import ExitCode
from pgflow_cli.sandbox import demo
from tests.status.conftest import validate
from tests.support.cli import run_cli


@pytest.fixture
def seeded(baseline_db):
    demo.seed(baseline_db.conninfo)
    return baseline_db


def _list(conninfo: str, *args: str) -> dict:
    result = run_cli("runs", "list", "--dsn", conninfo, "--format", "json", *args)
    assert result.code == ExitCode.OK, result.output
    return validate(result.stdout, "runs-list")


def test_list_filters_newest_first_and_pages_without_overlap(seeded):
    started = _list(seeded.conninfo, "--flow", "processOrder", "--status", "started")
    assert [r["status"] for r in started["runs"]] == ["started", "started"] and started["next_before"] is None
    every = _list(seeded.conninfo, "--limit", "1000")["runs"]
    keys = [(r["started_at"], r["run_id"]) for r in every]
    assert keys == sorted(keys, reverse=True) and len(every) == 19
    seen, before = [], None
    while True:
        page = _list(seeded.conninfo, "--limit", "4", *(["--before", before] if before else []))
        seen += [r["run_id"] for r in page["runs"]]
        before = page["next_before"]
        if before is None:
            break
    assert seen == [r["run_id"] for r in every]


def test_list_text_gives_a_next_line_that_repeats_the_filters(seeded):
    result = run_cli("runs", "list", "--dsn", seeded.conninfo, "--flow", "greetUser", "--limit", "2")
    assert result.code == ExitCode.OK, result.output
    next_line = [line for line in result.stdout.splitlines() if line.startswith("next: ")]
    assert next_line and next_line[0].startswith("next: pgflow runs list --dsn '")  # the target, as given
    assert " --flow greetUser --limit 2 --before " in next_line[0]


def test_list_errors(seeded):
    bad = run_cli("runs", "list", "--dsn", seeded.conninfo, "--status", "running")
    assert bad.code == ExitCode.USAGE and "unknown run status 'running'" in bad.stderr
    assert run_cli("runs", "list", "--dsn", seeded.conninfo, "--flow", "nope").code == ExitCode.CONFLICT
    nowhere = run_cli("runs", "list", "--dsn", seeded.conninfo, "--before", "6f1c2a9e-8d3b-4c5e-9f10-2a3b4c5d6e7f")
    assert nowhere.code == ExitCode.CONFLICT


def test_show_a_failed_run_has_steps_tasks_attempts_and_errors_but_no_bodies(seeded):
    failed = _list(seeded.conninfo, "--flow", "processOrder", "--status", "failed")["runs"]
    run_id = failed[0]["run_id"]
    result = run_cli("runs", "show", run_id, "--dsn", seeded.conninfo, "--format", "json")
    assert result.code == ExitCode.OK, result.output
    doc = validate(result.stdout, "runs-show")
    assert doc["run"]["status"] == "failed" and "output" not in doc["run"]
    steps = {s["step_slug"]: s for s in doc["steps"]}
    assert steps["chargeCard"]["status"] == "failed" and "card declined" in steps["chargeCard"]["error_message"]
    charge = next(t for t in doc["tasks"] if t["step_slug"] == "chargeCard")
    assert charge["attempts_count"] == 1 and charge["status"] == "failed"
    assert all("output" not in t for t in doc["tasks"])
    # the run input ({"amount": ..., "items": [...]}) and message bodies never appear
    text = run_cli("runs", "show", run_id, "--dsn", seeded.conninfo, "--format", "plain")
    assert text.code == ExitCode.OK and "chargeCard" in text.stdout and "card declined" in text.stdout
    # the database object names the server's socket directory, whose random name may hold any letters
    shown = json.dumps({key: value for key, value in doc.items() if key != "database"}) + text.stdout
    for item in ("bike", '"tv"', '"items"'):
        assert item not in shown


def test_show_output_only_when_asked(seeded):
    done = _list(seeded.conninfo, "--flow", "greetUser", "--status", "completed")["runs"][0]["run_id"]
    plain = run_cli("runs", "show", done, "--dsn", seeded.conninfo, "--format", "plain")
    assert "Hello, user-" not in plain.stdout
    shown = run_cli("runs", "show", done, "--dsn", seeded.conninfo, "--show-output", "--format", "json")
    doc = validate(shown.stdout, "runs-show")
    assert doc["show_output"] is True and "Hello, user-" in str(doc["run"]["output"])
    text = run_cli("runs", "show", done, "--dsn", seeded.conninfo, "--show-output", "--format", "markdown")
    assert "Hello, user-" in text.stdout and "| step" in text.stdout


def test_show_bad_and_unknown_run_ids(db):
    bad = run_cli("runs", "show", "not-a-uuid", "--dsn", db.conninfo)
    assert bad.code == ExitCode.USAGE and "is neither a run id nor a prefix of one" in bad.stderr
    assert "Traceback" not in bad.output
    missing = run_cli("runs", "show", "6f1c2a9e-8d3b-4c5e-9f10-2a3b4c5d6e7f", "--dsn", db.conninfo)
    assert missing.code == ExitCode.CONFLICT and "no run 6f1c2a9e" in missing.stderr


def test_latest_level_map_step_tasks_and_task_limit(db):
    conn = db.connect()
    conn.execute("SELECT pgflow.create_flow('fanOut')")
    conn.execute("SELECT pgflow.add_step('fanOut', 'items', step_type => 'map')")
    run_id = conn.execute("SELECT run_id FROM pgflow.start_flow('fanOut', '[1, 2, 3, 4, 5]'::jsonb)").fetchone()[0]
    result = run_cli("runs", "show", str(run_id), "--dsn", db.conninfo, "--max-tasks", "2", "--format", "json")
    assert result.code == ExitCode.OK, result.output
    doc = validate(result.stdout, "runs-show")
    assert (doc["tasks_total"], doc["tasks_shown"]) == (5, 2)
    assert {t["execution_mode"] for t in doc["tasks"]} == {"queue"}
    text = run_cli("runs", "show", str(run_id), "--dsn", db.conninfo, "--max-tasks", "2")
    assert "3 more task(s) not shown" in text.stdout


def test_show_what_the_handler_asked_for_with_a_failure(db):
    """A retry delay and a fail-now are shown with the task (the baseline level has neither: null, false)."""
    from tests.runtime.driver import Runtime

    rt = Runtime(db.connect(), level="upgraded")
    rt.flow("steered", [{"slug": "each", "step_type": "map", "when_exhausted": "skip"}], max_attempts=3)
    retried, ended = rt.start("steered", ["later", "plain"]), rt.start("steered", ["now"])
    assert len(rt.poll("steered")) == 3
    rt.one("SELECT * FROM pgflow.fail_task(%s, 'each', 0, 'busy', 20, false)", (retried,))
    rt.fail(retried, "each", 1, "plain")
    rt.one("SELECT * FROM pgflow.fail_task(%s, 'each', 0, 'gone', NULL, true)", (ended,))

    shown = {}
    for run_id in (retried, ended):
        result = run_cli("runs", "show", str(run_id), "--dsn", db.conninfo, "--format", "json")
        assert result.code == ExitCode.OK, result.output
        shown[run_id] = [(t["status"], t["requested_retry_delay"], t["failed_now"])
                         for t in validate(result.stdout, "runs-show")["tasks"]]
    assert shown == {retried: [("queued", 20, False), ("queued", None, False)], ended: [("failed", None, True)]}
    assert "queued (retry in 20s asked)" in run_cli("runs", "show", str(retried), "--dsn", db.conninfo).stdout
    assert "failed (fail-now)" in run_cli("runs", "show", str(ended), "--dsn", db.conninfo).stdout


def test_show_on_the_baseline_level_has_no_directive_but_the_same_fields(seeded):
    failed = _list(seeded.conninfo, "--flow", "processOrder", "--status", "failed")["runs"][0]["run_id"]
    doc = validate(run_cli("runs", "show", failed, "--dsn", seeded.conninfo, "--format", "json").stdout, "runs-show")
    assert {(t["requested_retry_delay"], t["failed_now"]) for t in doc["tasks"]} == {(None, False)}

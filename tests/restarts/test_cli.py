"""`pgflow runs cancel | retry | resume` (the real command in a subprocess) and the lineage `runs show`
prints: every format, JSON checked against its schema, the documented exit codes, run-id prefixes."""

from __future__ import annotations

import json
import uuid

import psycopg

from pgflow_cli.errors import ExitCode
from tests.permissions.test_worker_role import ROLE_GRANTS
from tests.support.cli import run_cli
from tests.support.schemas import validate_kind

FORMATS = ("table", "plain", "markdown")


def _pgflow(db, *args: str, **kwargs):
    return run_cli(*args, "--dsn", db.conninfo, **kwargs)


def _failed_map(rt) -> uuid.UUID:
    """A run of a 4-element map whose element 2 failed after the others completed."""
    rt.flow("cli_map", [{"slug": "each", "step_type": "map"}], max_attempts=1, base_delay=0)
    run_id = rt.start("cli_map", [1, 2, 3, 4])
    claimed = sorted(rt.poll("cli_map"), key=lambda task: task["task_index"] == 2)
    for task in claimed:
        if task["task_index"] == 2:
            rt.fail(run_id, "each", 2, "element 2 broke")
        else:
            rt.complete(run_id, "each", task["task_index"], {"i": task["task_index"]})
    assert rt.run(run_id)["status"] == "failed"
    return run_id


def test_resume_and_retry_by_prefix_in_every_format(rt, db):
    source = _failed_map(rt)
    result = _pgflow(db, "runs", "resume", str(source)[:8], "--format", "json")
    assert result.code == ExitCode.OK, result.output
    doc = json.loads(result.stdout)
    assert validate_kind(doc) == "runs-resume"
    assert (doc["source"]["run_id"], doc["run"]["restart_of_run_id"]) == (str(source), str(source))
    assert (doc["reused_tasks"], doc["queued_tasks"]) == (3, 1)
    for output_format in FORMATS:
        shown = _pgflow(db, "runs", "resume", str(source), "--format", output_format)
        assert shown.code == ExitCode.OK and "reused 3 completed task(s), queued 1 task(s)" in shown.stdout, shown.output

    retried = json.loads(_pgflow(db, "runs", "retry", str(source), "--format", "json").stdout)
    assert validate_kind(retried) == "runs-retry"
    assert (retried["reused_tasks"], retried["queued_tasks"]) == (0, 4)
    for output_format in FORMATS:
        shown = _pgflow(db, "runs", "retry", str(source), "--format", output_format)
        assert shown.code == ExitCode.OK and f"retried run {source}" in shown.stdout, shown.output

    # runs show: the source lists its restarts, a restart names its source
    show = json.loads(_pgflow(db, "runs", "show", str(source), "--format", "json").stdout)
    assert validate_kind(show) == "runs-show"
    assert [r["restart_kind"] for r in show["restarted_as"]] == ["resume"] * 4 + ["retry"] * 4
    new = doc["run"]["run_id"]
    plain = _pgflow(db, "runs", "show", new, "--format", "plain").stdout
    assert f"resume of run {source}" in plain
    assert f"restarted as: {new} (resume, started)" in _pgflow(db, "runs", "show", str(source), "--format",
                                                                "plain").stdout


def test_restart_refusals_exit_with_the_documented_codes(rt, db):
    rt.flow("cli_busy", [{"slug": "a"}])
    started = rt.start("cli_busy", {})
    for command in ("retry", "resume"):
        refused = _pgflow(db, "runs", command, str(started))
        assert refused.code == ExitCode.CONFLICT and "only a failed (or cancelled) run" in refused.stderr, refused.output
        missing = _pgflow(db, "runs", command, str(uuid.uuid4()))
        assert missing.code == ExitCode.CONFLICT and "no run" in missing.stderr, missing.output
        assert _pgflow(db, "runs", command, "xyz").code == ExitCode.USAGE


def test_cancel_asks_for_yes_without_a_terminal_and_reports_in_every_format(rt, db):
    rt.flow("cli_stop", [{"slug": "each", "step_type": "map"}])
    runs = [rt.start("cli_stop", [1, 2, 3]) for _ in range(len(FORMATS) + 1)]

    refused = _pgflow(db, "runs", "cancel", str(runs[0]))
    assert refused.code == ExitCode.USAGE and "--yes" in refused.stderr, refused.output
    assert rt.run(runs[0])["status"] == "started"

    result = _pgflow(db, "runs", "cancel", str(runs[0])[:8], "--yes", "--reason", "wrong batch", "--format", "json")
    assert result.code == ExitCode.OK, result.output
    doc = json.loads(result.stdout)
    assert validate_kind(doc) == "runs-cancel"
    assert (doc["run"]["cancel_reason"], doc["already_cancelled"], doc["tasks_cancelled"]) == ("wrong batch", False, 3)
    again = json.loads(_pgflow(db, "runs", "cancel", str(runs[0]), "--yes", "--format", "json").stdout)
    assert again["already_cancelled"] is True and again["run"]["cancel_reason"] == "wrong batch"
    for run_id, output_format in zip(runs[1:], FORMATS, strict=True):
        shown = _pgflow(db, "runs", "cancel", str(run_id), "-y", "--format", output_format)
        assert shown.code == ExitCode.OK and "3 task(s) cancelled" in shown.stdout, shown.output
    plain = _pgflow(db, "runs", "show", str(runs[0]), "--format", "plain").stdout
    assert "cancelled " in plain and ": wrong batch" in plain

    rt.flow("cli_done", [{"slug": "a"}])
    done = rt.start("cli_done", {})
    rt.drive("cli_done", lambda task: 1)
    late = _pgflow(db, "runs", "cancel", str(done), "--yes")
    assert late.code == ExitCode.CONFLICT and "already completed" in late.stderr, late.output
    assert _pgflow(db, "runs", "cancel", str(done), "--yes", "--reason", " ").code == ExitCode.USAGE


def test_a_worker_role_may_not_cancel_and_is_told_why(rt, db):
    rt.flow("cli_role", [{"slug": "a"}])
    run_id = rt.start("cli_role", {})
    role = f"worker_{uuid.uuid4().hex[:8]}"
    rt.conn.execute(f'CREATE ROLE "{role}" LOGIN NOSUPERUSER')
    rt.conn.execute(ROLE_GRANTS.format(role=f'"{role}"'))
    result = run_cli("runs", "cancel", str(run_id), "--yes", "--dsn", f"{db.conninfo} user={role}")
    assert result.code == ExitCode.CONNECTION and f'role "{role}" may not cancel runs' in result.stderr, result.output
    with psycopg.connect(db.conninfo) as conn:
        assert conn.execute("SELECT status FROM pgflow.runs WHERE run_id = %s", (run_id,)).fetchone()[0] == "started"

"""Issue 16 item 2: ``next:`` lines and hints repeat the target option, and suggest only commands that
succeed in the current state; pasted, they work."""

from __future__ import annotations

import json
import shlex

from pgflow_cli.cli.common import PASSWORD_LEFT_OUT, with_target
from pgflow_cli.db import Target, without_password
from pgflow_cli.errors import ExitCode
from tests.audit.helpers import define_flow
from tests.output.helpers import leave_in_progress
from tests.support.cli import run_cli
from tests.support.schemas import validate


def test_with_target_repeats_the_option_without_the_password():
    url = Target("postgresql://alice:s3cr3t-pw@db.example:6432/app?sslmode=require", "--dsn")
    text = with_target("next: pgflow migrate plan, then `pgflow migrate apply --dry-run`; pgflow sandbox up", url)
    assert "s3cr3t" not in text
    assert text == ("next: pgflow migrate plan --dsn 'postgresql://alice@db.example:6432/app?sslmode=require', "
                    "then `pgflow migrate apply --dsn 'postgresql://alice@db.example:6432/app?sslmode=require' "
                    f"--dry-run`; pgflow sandbox up ({PASSWORD_LEFT_OUT})")
    keywords = Target("host=db port=5 dbname=app password='x y z'", "--dsn")
    assert with_target("pgflow audit", keywords, note=False) == "pgflow audit --dsn 'dbname=app host=db port=5'"
    assert with_target("pgflow audit", Target("host=db port=5 dbname=app", "--dsn")) == \
        "pgflow audit --dsn 'dbname=app host=db port=5'"  # no password given, none left out: no note
    assert with_target("pgflow fence status", Target("host=/s", "sandbox")) == "pgflow fence status --sandbox"
    assert with_target("pgflow audit", Target("", "DATABASE_URL")) == "pgflow audit"  # the environment still holds it
    twice = with_target(with_target("pgflow audit", keywords), keywords)
    assert twice.count("--dsn") == 1


def test_without_password_keeps_everything_else():
    assert without_password("postgresql://u:p%40ss@h/db?password=x&application_name=a") == \
        "postgresql://u@h/db?application_name=a"
    assert "password" not in without_password("host=h password=secret user=u")


def _plan(database) -> tuple[int, dict]:
    result = run_cli("migrate", "plan", "--dsn", database.conninfo, "--format", "json")
    doc = json.loads(result.stdout)
    validate(doc, "migrate-plan")
    return result.code, doc


def _paste(command: str):
    words = shlex.split(command)
    assert words[0] == "pgflow"
    return run_cli(*words[1:])


def test_plan_next_commands_work_when_pasted(baseline_db):
    code, doc = _plan(baseline_db)
    assert code == ExitCode.OK
    dsn = shlex.quote(without_password(baseline_db.conninfo))
    assert doc["next"] == [f"pgflow migrate apply --dsn {dsn} --dry-run", f"pgflow migrate apply --dsn {dsn}"]
    assert not doc["next_is_choice"]
    text = run_cli("migrate", "plan", "--dsn", baseline_db.conninfo).stdout
    assert f"next: pgflow migrate apply --dsn {dsn} --dry-run, then pgflow migrate apply --dsn {dsn}" in text
    for command in doc["next"]:
        result = _paste(command)
        assert result.code == ExitCode.OK, (command, result.output)
    assert _plan(baseline_db)[1]["next"] == []  # up to date now: nothing to suggest


def test_plan_without_pgmq_suggests_installing_it_and_the_suggestion_works(empty_db):
    code, doc = _plan(empty_db)
    assert code == ExitCode.OK and not doc["pgmq_installed"]
    assert len(doc["next"]) == 1 and doc["next"][0].endswith("--install-pgmq")
    assert not any("--dry-run" in command for command in doc["next"])  # refused with --install-pgmq
    result = _paste(doc["next"][0])
    assert result.code == ExitCode.OK, result.output


def test_plan_of_a_migration_in_progress_suggests_resume_or_abort_not_a_dry_run(baseline_db):
    leave_in_progress(baseline_db)
    code, doc = _plan(baseline_db)
    assert code == ExitCode.OK
    dsn = shlex.quote(without_password(baseline_db.conninfo))
    assert doc["next"] == [f"pgflow migrate apply --dsn {dsn}", f"pgflow migrate abort --dsn {dsn} 3"]
    assert doc["next_is_choice"]
    text = run_cli("migrate", "plan", "--dsn", baseline_db.conninfo).stdout
    assert " or pgflow migrate abort " in text and "--dry-run" not in text
    status = run_cli("migrate", "status", "--dsn", baseline_db.conninfo)
    assert f"`pgflow migrate abort --dsn {dsn} 3`" in " ".join(status.stdout.split())
    result = _paste(doc["next"][0])  # resume
    assert result.code == ExitCode.OK, result.output


def test_a_refused_plan_suggests_the_audit_only(baseline_db):
    conn = baseline_db.connect()
    define_flow(conn, "_hidden", ["work"])  # a flow slug the upgrade rejects (blocking)
    code, doc = _plan(baseline_db)
    assert code == ExitCode.FINDINGS and doc["refused"] is not None
    dsn = shlex.quote(without_password(baseline_db.conninfo))
    assert doc["next"] == [f"pgflow audit --dsn {dsn}"]
    result = run_cli("migrate", "plan", "--dsn", baseline_db.conninfo)
    assert "apply --dry-run" not in result.stdout
    assert f"pgflow audit --dsn {dsn}" in " ".join(result.output.split())  # the error's hint repeats the target


def test_audit_flow_filter_says_nothing_to_fix_in_it_and_names_blocking_findings_elsewhere(baseline_db):
    conn = baseline_db.connect()
    define_flow(conn, "orders", ["ship"])
    define_flow(conn, "_hidden", ["work"])
    result = run_cli("audit", "--dsn", baseline_db.conninfo, "--flow", "orders", "--format", "json")
    doc = json.loads(result.stdout)
    validate(doc, "audit")
    assert result.code == ExitCode.OK
    assert doc["summary"]["blocking_elsewhere"] == ["_hidden"]
    assert doc["summary"]["next"].startswith("nothing to fix in orders; but blocking findings elsewhere (_hidden)")
    text = " ".join(run_cli("audit", "--dsn", baseline_db.conninfo, "--flow", "orders").stdout.split())
    assert "next: nothing to fix in orders; but blocking findings elsewhere (_hidden) still make `pgflow migrate` " \
        "refuse" in text
    dsn = shlex.quote(without_password(baseline_db.conninfo))
    assert f"`pgflow audit --dsn {dsn}` without --flow" in text

    conn.execute("DELETE FROM pgflow.steps WHERE flow_slug = '_hidden'")
    conn.execute("DELETE FROM pgflow.flows WHERE flow_slug = '_hidden'")
    clean = json.loads(run_cli("audit", "--dsn", baseline_db.conninfo, "--flow", "orders", "--format", "json").stdout)
    assert clean["summary"]["next"].startswith("nothing to fix in orders; nothing blocks elsewhere")


def test_error_hints_repeat_the_sandbox_option():
    text = with_target("resume with `pgflow migrate apply`, or undo with `pgflow migrate abort 3`",
                       Target("host=/tmp/x", "sandbox"))
    assert text == "resume with `pgflow migrate apply --sandbox`, or undo with `pgflow migrate abort --sandbox 3`"

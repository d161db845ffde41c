"""`pgflow runs start` / `pgflow runs wait`, run-id prefixes everywhere a run id is taken, and JSON
inputs refused with exit 2 and the path of the bad value (the real command in a subprocess; the
flows' workers run in the test process)."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from pgflow_cli.errors import ExitCode
from tests.client.flows import approve, compile_flows, failing, greet, held, mapper
from tests.support.cli import run_cli
from tests.support.schemas import validate_kind


def _pgflow(db, *args: str, **kwargs):
    return run_cli(*args, "--dsn", db.conninfo, **kwargs)


def _runs(db, flow_slug: str) -> list[str]:
    with psycopg.connect(db.conninfo) as conn:
        rows = conn.execute("SELECT run_id FROM pgflow.runs WHERE flow_slug = %s ORDER BY started_at", (flow_slug,))
        return [str(row[0]) for row in rows]


def test_start_without_wait_starts_and_names_the_next_command(db):
    compile_flows(db.conninfo, greet)
    result = _pgflow(db, "runs", "start", "greetUser", "--input", '{"first": "Ada", "last": "L"}', "--format", "plain")
    assert result.code == ExitCode.OK, result.output
    [run_id] = _runs(db, "greetUser")
    assert result.stdout.splitlines()[0] == f"started run {run_id} of flow greetUser: started, 2 step(s) remaining"
    assert "next: pgflow runs wait --dsn " in result.stdout and result.stdout.rstrip().endswith(run_id)
    doc = json.loads(_pgflow(db, "runs", "start", "greetUser", "--format", "json").stdout)
    assert validate_kind(doc) == "runs-start" and doc["wait"] is None and doc["run"]["status"] == "started"


def test_start_wait_completed_exits_0_and_shows_the_output_only_when_asked(db, start_worker):
    start_worker(greet)
    plain = _pgflow(db, "runs", "start", "greetUser", "-i", '{"first": "Ada", "last": "Lovelace"}', "--wait",
                    "--format", "plain")
    assert plain.code == ExitCode.OK, plain.output
    assert ": completed (waited " in plain.stdout and "Lovelace" not in plain.stdout
    assert "started run" in plain.stderr and "waiting" in plain.stderr
    shown = _pgflow(db, "runs", "start", "greetUser", "-i", '{"first": "Ada", "last": "Lovelace"}', "--wait",
                    "--show-output", "--timeout", "60", "--format", "json")
    assert shown.code == ExitCode.OK, shown.output
    doc = json.loads(shown.stdout)
    assert validate_kind(doc) == "runs-start"
    assert doc["wait"]["outcome"] == "completed" and doc["wait"]["output"] == {"greeting": "Hello, Ada Lovelace!"}
    assert doc["run"]["status"] == "completed" and doc["run"]["remaining_steps"] == 0 and doc["wait"]["failures"] == []
    markdown = _pgflow(db, "runs", "start", "greetUser", "-i", '{"first": "A", "last": "B"}', "--wait",
                       "--format", "markdown")
    table = _pgflow(db, "runs", "start", "greetUser", "-i", '{"first": "A", "last": "B"}', "--wait",
                    "--format", "table", env={"COLUMNS": "80"})
    assert markdown.code == table.code == ExitCode.OK and "completed" in markdown.stdout and "completed" in table.stdout


def test_start_wait_failed_exits_1_with_the_failed_steps_and_their_errors(db, start_worker):
    start_worker(failing)
    result = _pgflow(db, "runs", "start", "failing", "--wait", "--format", "plain")
    assert result.code == ExitCode.FINDINGS, result.output
    lines = result.stdout.splitlines()
    assert lines[0].endswith("failed (waited " + lines[0].split("(waited ")[1])
    assert lines[1] == "failed steps" and lines[2].split() == ["step", "task", "attempts", "error"]
    assert lines[3].split()[:4] == ["boom", "0", "2", "ValueError:"]
    assert "next: pgflow runs show --dsn" in result.stdout
    doc = json.loads(_pgflow(db, "runs", "wait", _runs(db, "failing")[0], "--format", "json").stdout)
    assert validate_kind(doc) == "runs-wait" and doc["wait"]["outcome"] == "failed"
    [failure] = doc["wait"]["failures"]
    assert failure["step_slug"] == "boom" and failure["tasks"][0]["attempts_count"] == 2
    assert failure["tasks"][0]["error_message"].startswith("ValueError: boom")


def test_the_deadline_exits_5_and_progress_goes_to_stderr_every_5_seconds(db):
    compile_flows(db.conninfo, held)
    result = _pgflow(db, "runs", "start", "held", "--wait", "--timeout", "6", "--format", "plain")
    assert result.code == ExitCode.DEADLINE, result.output
    [run_id] = _runs(db, "held")
    assert result.stdout.splitlines()[0].startswith(f"run {run_id} of flow held: still started after waiting 6.")
    progress = [line for line in result.stderr.splitlines() if line.startswith(f"waiting for run {run_id}")]
    assert progress == [f"waiting for run {run_id}: started, 2 step(s) remaining (waited 5 s)"]
    doc = json.loads(_pgflow(db, "runs", "wait", run_id[:8], "--timeout", "0", "--format", "json").stdout)
    assert validate_kind(doc) == "runs-wait" and doc["wait"]["outcome"] == "deadline"
    assert doc["wait"]["timeout_seconds"] == 0 and doc["run"]["remaining_steps"] == 2


def test_wait_takes_a_prefix_and_reports_a_run_that_ended_later(db, start_worker):
    compile_flows(db.conninfo, held)
    start_worker(held)
    started = _pgflow(db, "runs", "start", "held", "--format", "json")
    run_id = json.loads(started.stdout)["run"]["run_id"]
    approve(db.conninfo, run_id, {"ok": True})
    result = _pgflow(db, "runs", "wait", run_id[:6].upper(), "--show-output", "--format", "plain")
    assert result.code == ExitCode.OK, result.output
    assert result.stdout.splitlines()[:2] == [f"run {run_id} of flow held: completed (waited "
                                              + result.stdout.split("(waited ")[1].split(")")[0] + ")",
                                              'output: {"after":{"ok":true}}']


def _held_runs_sharing_a_prefix(db) -> tuple[str, str, str]:
    """Three runs: two whose ids share the prefix 'abcd12', one that starts with 'abcd99'."""
    compile_flows(db.conninfo, held)
    ids = ("abcd1234-0000-4000-8000-000000000001", "abcd1299-0000-4000-8000-000000000002",
           "abcd9900-0000-4000-8000-000000000003")
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        for run_id in ids:
            conn.execute("SELECT pgflow.start_flow('held', '{}'::jsonb, %s::uuid)", (run_id,))
    return ids


@pytest.mark.parametrize("command", [
    ["runs", "show", "{prefix}"],
    ["runs", "wait", "{prefix}", "--timeout", "0"],
    ["runs", "list", "--before", "{prefix}"],
    ["task", "show", "{prefix}", "approve"],
    ["task", "complete", "{prefix}", "approve", "--output", "true"],
    ["task", "fail", "{prefix}", "approve", "--error", "no"],
])
def test_every_command_taking_a_run_id_takes_a_unique_prefix_and_refuses_an_ambiguous_one(db, command):
    first, second, third = _held_runs_sharing_a_prefix(db)
    unique = run_cli(*(a.replace("{prefix}", "abcd99") for a in command), "--dsn", db.conninfo, "--format", "json")
    assert unique.code in (ExitCode.OK, ExitCode.DEADLINE), unique.output
    assert third in unique.stdout or (command[1] == "list" and unique.code == ExitCode.OK)
    ambiguous = run_cli(*(a.replace("{prefix}", "abcd12") for a in command), "--dsn", db.conninfo)
    assert ambiguous.code == ExitCode.USAGE, ambiguous.output
    assert "is ambiguous: 2 runs start with it" in ambiguous.stderr
    assert first in ambiguous.stderr and second in ambiguous.stderr and third not in ambiguous.stderr
    nothing = run_cli(*(a.replace("{prefix}", "ffff0") for a in command), "--dsn", db.conninfo)
    assert nothing.code == ExitCode.CONFLICT and "no run id starts with 'ffff0'" in nothing.stderr
    for bad in ("abc", "xyz12345", "abcd-1234"):
        refused = run_cli(*(a.replace("{prefix}", bad) for a in command), "--dsn", db.conninfo)
        assert refused.code == ExitCode.USAGE and "neither a run id nor a prefix" in refused.stderr, refused.output


def test_a_prefix_with_dashes_where_a_run_id_has_them_resolves(db):
    first, _second, _third = _held_runs_sharing_a_prefix(db)
    result = _pgflow(db, "runs", "show", first[:15], "--format", "json")
    assert result.code == ExitCode.OK and json.loads(result.stdout)["run"]["run_id"] == first


@pytest.mark.parametrize(("given", "path", "reason"), [
    ('{"name": "a\\u0000b"}', "$.name", "NUL character"),
    ('{"list": [1, "\\udc00"]}', "$.list[1]", "lone UTF-16 surrogate"),
    ('{"deep": ' + "[" * 600 + "]" * 600 + "}", "$.deep[0][0]", "nested deeper than 512 levels"),
    ('{"n": 1e-20000}', "$.n", "digits after the decimal point"),
])
def test_a_json_input_postgresql_would_refuse_exits_2_with_its_path(db, given, path, reason):
    compile_flows(db.conninfo, greet)
    result = _pgflow(db, "runs", "start", "greetUser", "--input", given)
    assert result.code == ExitCode.USAGE, result.output
    assert f"--input: the value at {path}" in result.stderr and reason in result.stderr
    assert "Traceback" not in result.output and _runs(db, "greetUser") == []


def test_inputs_from_a_file_and_from_stdin_and_what_is_not_json(db, tmp_path):
    compile_flows(db.conninfo, greet, mapper)
    source = tmp_path / "input.json"
    source.write_text('{"first": "From", "last": "File"}')
    assert _pgflow(db, "runs", "start", "greetUser", "--input", f"@{source}").code == ExitCode.OK
    assert _pgflow(db, "runs", "start", "greetUser", "--input", "@-", input='{"first": "In"}').code == ExitCode.OK
    with psycopg.connect(db.conninfo) as conn:
        inputs = [r[0] for r in conn.execute("SELECT input FROM pgflow.runs ORDER BY started_at")]
    assert inputs == [{"first": "From", "last": "File"}, {"first": "In"}]
    cases = [
        (["greetUser", "--input", "{not json"], ExitCode.USAGE, "--input is not valid JSON: Expecting property name"),
        (["greetUser", "--input", '{"a": NaN}'], ExitCode.USAGE, "NaN is not JSON"),
        (["greetUser", "--input", f"@{tmp_path / 'missing.json'}"], ExitCode.USAGE, "cannot read"),
        (["greetUser", "--timeout", "5"], ExitCode.USAGE, "--timeout needs --wait"),
        (["mapper", "--input", "{}"], ExitCode.USAGE, "input must be a JSON array"),
        (["noSuchFlow"], ExitCode.CONFLICT, 'flow "noSuchFlow" does not exist'),
        (["greetUser", "--format", "csv"], ExitCode.USAGE, "no csv format"),
    ]
    for args, code, message in cases:
        result = _pgflow(db, "runs", "start", *args)
        assert (result.code, message in result.stderr) == (code, True), (args, result.output)
        assert "Traceback" not in result.output
    assert len(_runs(db, "greetUser")) == 2 and _runs(db, "mapper") == []


def test_task_complete_output_is_checked_the_same_way(db):
    compile_flows(db.conninfo, held)
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        run_id = str(conn.execute("SELECT run_id FROM pgflow.start_flow('held', '{}')").fetchone()[0])
    result = _pgflow(db, "task", "complete", run_id, "approve", "--output", '{"note": "\\u0000"}')
    assert result.code == ExitCode.USAGE and "--output: the value at $.note contains the NUL" in result.stderr
    deep = _pgflow(db, "task", "complete", run_id, "approve", "--output", "[" * 100000)
    assert deep.code == ExitCode.USAGE and "nested deeper than 512 levels" in deep.stderr, deep.output


def test_wait_on_an_unknown_run_exits_6(db):
    result = _pgflow(db, "runs", "wait", str(uuid.uuid4()))
    assert result.code == ExitCode.CONFLICT and "no run " in result.stderr

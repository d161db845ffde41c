"""`pgflow status`: per flow runs, tasks, oldest queued task, stalled tasks, queues and workers.

The stalled count must be what `pgflow.requeue_stalled_tasks()` takes next: the tests call the
function after reading the status and compare.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from pgflow_cli import sqlfiles
from pgflow_cli.errors import ExitCode
from pgflow_cli.sandbox import demo
from tests.status.conftest import age_claims, claim_one, validate
from tests.support.cli import run_cli, sigint_as_at_a_terminal


def _status(conninfo: str, *args: str) -> dict:
    result = run_cli("status", "--dsn", conninfo, "--format", "json", *args)
    assert result.code == ExitCode.OK, result.output
    return validate(result.stdout, "status")


def _flow(document: dict, slug: str) -> dict:
    return next(f for f in document["flows"] if f["flow_slug"] == slug)


def test_baseline_demo_shows_runs_tasks_queues_and_the_stalled_claim(baseline_db):
    demo.seed(baseline_db.conninfo)
    conn = baseline_db.connect()
    doc = _status(baseline_db.conninfo)
    order = _flow(doc, "processOrder")
    assert order["runs"] == {"started": 2, "completed": 3, "failed": 2}
    assert order["tasks"]["started"] == 1  # the claim of the worker that vanished
    assert order["stalled_tasks"] == 0  # claimed moments ago: not stalled yet
    assert order["oldest_queued_task"]["step_slug"] == "validate" and order["oldest_queued_task"]["age_seconds"] >= 0
    assert doc["totals"]["runs_in_flight"] == 2 + 3 + 5  # processOrder, greetUser, one per legacy flow
    queues = {q["queue_name"]: q for q in order["queues"]}
    assert queues["processOrder"]["origin"] == "default" and queues["processOrder"]["messages"] >= 1
    # Billing and billing share one PGMQ table: both flows show it
    assert _flow(doc, "Billing")["queues"] and _flow(doc, "billing")["queues"]
    # the seed's workers stopped; the one that vanished registered moments ago
    assert order["workers"] == {"live": 1, "deprecated": 0, "stale": 0}

    age_claims(conn, "processOrder", 10 * 60)
    conn.execute("UPDATE pgflow.workers SET last_heartbeat_at = now() - interval '10 minutes' WHERE stopped_at IS NULL")
    doc = _status(baseline_db.conninfo, "--flow", "processOrder")
    assert [f["flow_slug"] for f in doc["flows"]] == ["processOrder"] and doc["other_queues"] == []
    assert _flow(doc, "processOrder")["stalled_tasks"] == 1
    assert _flow(doc, "processOrder")["workers"] == {"live": 0, "deprecated": 0, "stale": 1}
    assert conn.execute(sqlfiles.statement("queries/demo.sql", "requeue_stalled")).fetchone()[0] == 1
    assert _flow(_status(baseline_db.conninfo), "processOrder")["stalled_tasks"] == 0


def test_latest_level_counts_exactly_what_requeue_stalled_tasks_takes(db):
    conn = db.connect()
    conn.execute("SELECT pgflow.create_flow('shortJob', timeout => 5)")
    conn.execute("SELECT pgflow.add_step('shortJob', 'work')")
    conn.execute("SELECT pgflow.create_flow('longJob', timeout => 600)")
    conn.execute("SELECT pgflow.add_step('longJob', 'work')")
    for slug in ("shortJob", "shortJob", "longJob"):
        conn.execute("SELECT pgflow.start_flow(%s, '{}'::jsonb)", (slug,))
    assert claim_one(conn, "shortJob") == 1
    assert claim_one(conn, "longJob", "00000000-0000-4000-8000-0000000057a2") == 1
    age_claims(conn, "shortJob", 40)  # past 5 s + 30 s
    age_claims(conn, "longJob", 40)  # well within 600 s + 30 s
    doc = _status(db.conninfo)
    short, long_ = _flow(doc, "shortJob"), _flow(doc, "longJob")
    assert (short["stalled_tasks"], long_["stalled_tasks"]) == (1, 0)
    assert short["tasks"]["queued"] == 1 and short["tasks"]["started"] == 1
    assert doc["totals"]["stalled_tasks"] == conn.execute("SELECT pgflow.requeue_stalled_tasks()").fetchone()[0] == 1


def test_the_stalled_query_writes_the_rule_of_the_function_file():
    """The status query's candidates are those of requeue_stalled_tasks, line for line: a changed rule
    in either file breaks this test."""
    function = sqlfiles.load("functions/maintenance/requeue_stalled_tasks.sql")
    candidates = function.split("WITH candidates AS (\n", 1)[1].split("    ORDER BY", 1)[0]
    assert sqlfiles.statement("queries/status.sql", "stalled").count(candidates) == 1
    without_manual = "".join(line for line in candidates.splitlines(keepends=True) if "execution_mode" not in line)
    assert sqlfiles.statement("queries/status.sql", "stalled_before_manual_tasks").count(without_manual) == 1


def test_the_workers_query_writes_the_liveness_rule_of_coverage():
    """The status query's workers_x is the coverage fragment's, line for line."""
    fragment = sqlfiles.load("fragments/coverage_sources.sql")
    workers_x = fragment.split("), workers_x AS (\n", 1)[1].split("), pgmq_rel AS (", 1)[0]
    assert workers_x.count("\n") >= 8
    assert sqlfiles.statement("queries/status.sql", "workers").count(f"WITH workers_x AS (\n{workers_x})") == 1


def test_unknown_flow_and_empty_database(db):
    result = run_cli("status", "--dsn", db.conninfo, "--flow", "nope")
    assert result.code == ExitCode.CONFLICT and "no flow named 'nope'" in result.stderr
    assert "Traceback" not in result.output
    doc = _status(db.conninfo)
    assert doc["flows"] == [] and doc["totals"]["runs_in_flight"] == 0


def test_no_pgflow_schema_is_a_connection_class_error(empty_db):
    result = run_cli("status", "--dsn", empty_db.conninfo)
    assert result.code == ExitCode.CONNECTION, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("fmt", ["plain", "markdown", "table"])
def test_text_formats_piped_have_no_escape_codes_or_trailing_spaces(baseline_db, fmt):
    demo.seed(baseline_db.conninfo)
    result = run_cli("status", "--dsn", baseline_db.conninfo, "--format", fmt, env={"COLUMNS": "80"})
    assert result.code == ExitCode.OK, result.output
    assert "\x1b" not in result.stdout
    assert "processOrder" in result.stdout and "run(s) in flight" in result.stdout
    if fmt != "table":
        assert all(line == line.rstrip() for line in result.stdout.splitlines())
    if fmt == "markdown":
        assert "| flow" in result.stdout and "|---" in result.stdout.replace(":", "")


def test_piped_default_is_plain(db):
    result = run_cli("status", "--dsn", db.conninfo)
    assert result.code == ExitCode.OK and "\x1b" not in result.stdout
    assert "0 flow(s): no run in flight" in result.stdout


def test_watch_redraws_until_ctrl_c_and_exits_130(db):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    proc = subprocess.Popen([sys.executable, "-m", "pgflow_cli", "status", "--dsn", db.conninfo, "--watch", "0.2",
                             "--format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=sigint_as_at_a_terminal)
    try:
        first, second = proc.stdout.readline(), proc.stdout.readline()  # two snapshots: it redraws
        validate(first, "status")
        validate(second, "status")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == ExitCode.INTERRUPTED
        assert "stopped watching" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_upstream_installed_database(published_db):
    """No stalled recovery and no worker routes there: said so (null, "not analysed"), the rest shown;
    the published fixture's broken queues (table dropped, name at the identifier limit) fail nothing."""
    doc = _status(published_db.conninfo)
    assert doc["stalled_recovery"] is False
    greet = _flow(doc, "greetUser")
    assert greet["runs"]["started"] == 2 and greet["tasks"]["queued"] >= 1
    assert greet["stalled_tasks"] is None and greet["workers"] is None
    assert _flow(doc, "audit_log")["queues"][0]["messages"] is None  # its table was dropped
    assert "adhoc_jobs" in {q["queue_name"] for q in doc["other_queues"]}
    text = run_cli("status", "--dsn", published_db.conninfo, "--format", "plain")
    assert text.code == ExitCode.OK and "unknown (not analysed)" in text.stdout and "?" not in text.stdout


@pytest.mark.parametrize("columns", [60, 80, 200])
def test_table_fits_the_width_and_keeps_words_whole(baseline_db, columns):
    demo.seed(baseline_db.conninfo)
    for args in (["status"], ["runs", "list", "--limit", "3"]):
        result = run_cli(*args, "--dsn", baseline_db.conninfo, "--format", "table",
                         env={"COLUMNS": str(columns), "NO_COLOR": "1"})
        assert result.code == ExitCode.OK, result.output
        assert "\x1b" not in result.stdout
        assert all(len(line) <= columns for line in result.stdout.splitlines() if not line.startswith("next: ")), \
            result.stdout
        if args == ["status"]:
            assert "processOrder" in result.stdout or "processOr" in result.stdout
            assert (f"(left out at {columns} columns:" in result.stdout) == (columns < 100)  # narrow: fewer columns, said so
            assert "run(s) in flight" in result.stdout


def test_ascii_stdout_does_not_crash(baseline_db):
    demo.seed(baseline_db.conninfo)
    for fmt in ("table", "plain", "markdown", "json"):
        result = run_cli("status", "--dsn", baseline_db.conninfo, "--format", fmt, env={"PYTHONIOENCODING": "ascii"})
        assert result.code == ExitCode.OK, result.output
        result.stdout.encode("ascii")


def test_permanently_stalled_tasks_are_counted_apart(db):
    conn = db.connect()
    conn.execute("SELECT pgflow.create_flow('shortJob', timeout => 5)")
    conn.execute("SELECT pgflow.add_step('shortJob', 'work')")
    conn.execute("SELECT pgflow.start_flow('shortJob', '{}'::jsonb)")
    claim_one(conn, "shortJob")
    age_claims(conn, "shortJob", 40)
    conn.execute("UPDATE pgflow.step_tasks SET requeued_count = 3 WHERE flow_slug = 'shortJob'")  # its 4th stall
    assert _flow(_status(db.conninfo), "shortJob")["stalled_tasks"] == 1
    conn.execute("SELECT pgflow.requeue_stalled_tasks()")  # gives up on it
    flow = _flow(_status(db.conninfo), "shortJob")
    assert (flow["stalled_tasks"], flow["permanently_stalled_tasks"], flow["tasks"]["started"]) == (0, 1, 1)
    text = run_cli("status", "--dsn", db.conninfo, "--format", "plain")
    assert "0 (+1 given up)" in text.stdout

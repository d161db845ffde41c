"""`pgflow coverage`: each route state produced by real reference workers started with
`pgflow worker` (running, stopped, killed, deprecated while busy, fenced), work waiting,
workers polling queues no route owns, `--wait` ending covered and timing out, the formats,
`--sql` in psql, and a SELECT-only role."""

from __future__ import annotations

import csv
import io
import json
import shutil
import signal
import subprocess
import sys

import pytest

from pgflow_cli.operations import coverage as coverage_op
from pgflow_cli.sandbox import find_bindir
from tests.stage2.helpers import REPO, CliWorker, clean_env, flow_target
from tests.support.cli import run_cli
from tests.worker.helpers import wait_until


def routes(db, *args: str) -> tuple[int, dict]:
    result = run_cli("coverage", "--dsn", db.conninfo, "--format", "json", *args)
    assert result.code in (0, 1), result.output
    document = json.loads(result.stdout)
    return result.code, {(r["flow_slug"], r["step_slug"]): r for r in document["routes"]} | {"_doc": document}


def state_of(db, flow: str, step: str | None = None, *args: str) -> str:
    return routes(db, "--flow", flow, *args)[1][(flow, step)]["state"]


@pytest.fixture
def workers():
    started: list[CliWorker] = []
    yield started
    for proc in started:
        proc.kill()


def start(workers, db, name: str, *args: str, env: dict | None = None) -> CliWorker:
    proc = CliWorker.start(db.conninfo, flow_target(name), *args, env=env)
    workers.append(proc)
    proc.wait_started()
    return proc


def test_covered_then_uncovered_with_work_waiting(db, workers):
    proc = start(workers, db, "plain", "--worker-version", "release-7")
    code, found = routes(db, "--flow", "cliPlain")
    route = found[("cliPlain", None)]
    assert code == 0
    assert (route["state"], route["live_workers"], route["live_versions"]) == ("covered", 1, ["release-7"])
    assert (route["queue_name"], route["queue_mode"], route["functions"]) == ("cliplain", "flow", ["cliPlain-worker"])

    proc.signal(signal.SIGTERM)
    assert proc.wait_exit() == 0
    conn = db.connect()
    conn.execute("SELECT pgflow.start_flow('cliPlain', '{}')")
    code, found = routes(db, "--flow", "cliPlain")
    route = found[("cliPlain", None)]
    assert code == 1
    assert (route["state"], route["work_waiting"], route["backlog"]) == ("uncovered", True, 1)
    assert route["oldest_message_age_seconds"] is not None

    table = run_cli("coverage", "--dsn", db.conninfo, "--flow", "cliPlain")
    assert table.code == 1
    assert "uncovered (work waiting)" in table.stdout and "cliplain" in table.stdout


def test_step_routes_each_need_their_own_worker(db, workers):
    first = start(workers, db, "queued", "--step", "first", "--worker-version", "v2")
    assert "flow=cliQueued step=first queue=cliqueued__first" in first.wait_for_line(" started: flow=", which="stderr")
    conn = db.connect()
    conn.execute("SELECT pgflow.start_flow('cliQueued', '{}')")
    wait_until(lambda: conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE step_slug = 'second'").fetchone()[0],
               "the first step to complete and release the second")
    code, found = routes(db, "--flow", "cliQueued")
    assert code == 1
    assert [(k[1], v["state"], v["queue_name"], v["live_versions"], v["work_waiting"]) for k, v in found.items()
            if k != "_doc"] == [("first", "covered", "cliqueued__first", ["v2"], False),
                                ("second", "uncovered", "cliqueued__second", [], True)]
    start(workers, db, "queued", "--step", "second")
    wait_until(lambda: routes(db, "--flow", "cliQueued")[0] == 0, "both step routes to be covered")
    wait_until(lambda: conn.execute("SELECT status FROM pgflow.runs").fetchone()[0] == "completed", "the run")


def test_killed_worker_is_stale(db, workers):
    proc = start(workers, db, "plain")
    proc.kill()  # SIGKILL: the row is never marked stopped
    wait_until(lambda: state_of(db, "cliPlain", None, "--heartbeat-window", "1") == "stale", "the route to turn stale")
    assert state_of(db, "cliPlain") in ("covered", "stale")  # the default window may still count the last beat


def test_deprecated_busy_worker_is_draining_then_the_fence_shows(db, workers, tmp_path):
    release = tmp_path / "release"
    proc = start(workers, db, "blocking", env={"PGFLOW_TEST_RELEASE": str(release)})
    conn = db.connect()
    conn.execute("SELECT pgflow.start_flow('cliBlocking', '{}')")
    proc.wait_for_line("HOLDING")
    # the rollout fence: disable the function, deprecate its workers
    conn.execute("UPDATE pgflow.worker_functions SET enabled = false WHERE function_name = 'cliBlocking-worker'")
    conn.execute("UPDATE pgflow.workers SET deprecated_at = now() WHERE function_name = 'cliBlocking-worker'")
    wait_until(lambda: any("deprecated: stops polling" in line for line in proc.lines("stderr")), "the worker to notice")
    route = routes(db, "--flow", "cliBlocking", "--heartbeat-window", "600")[1][("cliBlocking", None)]
    assert (route["state"], route["draining_workers"], route["live_workers"]) == ("draining", 1, 0)
    release.touch()
    assert proc.wait_exit() == 0
    route = routes(db, "--flow", "cliBlocking")[1][("cliBlocking", None)]
    assert (route["state"], route["fenced_functions"]) == ("fenced", ["cliBlocking-worker"])
    # a restart is refused while fenced
    restart = run_cli("worker", flow_target("blocking"), "--dsn", db.conninfo)
    assert restart.code == 6


def test_missing_queue_and_unowned_workers(db, workers):
    proc = start(workers, db, "plain")
    conn = db.connect()
    conn.execute("SELECT pgmq.drop_queue('cliplain')")
    assert state_of(db, "cliPlain") == "queue_missing"
    conn.execute("SELECT pgflow.delete_flow_and_data('cliPlain')")
    code, found = routes(db)
    unowned = found["_doc"]["unowned_workers"]
    assert code == 0  # no routes left: nothing uncovered
    assert [(w["worker_id"], w["queue_name"], w["flow_slug"]) for w in unowned] == [(proc.worker_id, "cliplain", "cliPlain")]
    table = run_cli("coverage", "--dsn", db.conninfo)
    assert "workers polling queues no route owns" in table.stdout and proc.worker_id in table.stdout


def test_unknown_flow_is_exit_6_without_wait(db):
    result = run_cli("coverage", "--dsn", db.conninfo, "--flow", "nope")
    assert result.code == 6 and "no flow named 'nope'" in result.stderr


def test_wait_ends_covered_once_the_worker_starts(db, workers):
    waiter = subprocess.Popen(
        [sys.executable, "-m", "pgflow_cli", "coverage", "--dsn", db.conninfo, "--flow", "cliPlain", "--wait",
         "--timeout", "120", "--interval", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=str(REPO))
    try:
        first = waiter.stderr.readline()
        assert "waiting" in first and "flow cliPlain: does not exist yet" in first, first
        start(workers, db, "plain")
        out, err = waiter.communicate(timeout=120)
        assert waiter.returncode == 0, err
        assert "covered" in out
    finally:
        if waiter.poll() is None:
            waiter.kill()


def test_wait_times_out_naming_the_missing_routes(db):
    conn = db.connect()
    conn.execute("SELECT pgflow.create_flow('waitFlow')")
    result = run_cli("coverage", "--dsn", db.conninfo, "--wait", "--timeout", "1", "--interval", "0.2")
    assert result.code == 5, result.output
    assert "waitFlow (queue waitflow): uncovered" in result.stderr
    assert "waiting (" in result.stderr  # progress lines


def test_csv_json_and_sql_agree(db, workers):
    start(workers, db, "plain")
    rows = list(csv.DictReader(io.StringIO(run_cli("coverage", "--dsn", db.conninfo, "--format", "csv").stdout)))
    assert [(r["flow_slug"], r["state"], r["queue_name"]) for r in rows] == [("cliPlain", "covered", "cliplain")]
    script = run_cli("coverage", "--sql", "--flow", "cliPlain", "--heartbeat-window", "30")
    assert script.code == 0 and "%(" not in script.stdout and "'{cliPlain}'" in script.stdout
    psql = shutil.which("psql", path=str(find_bindir())) or shutil.which("psql")
    if psql is None:
        pytest.skip("psql is not installed")
    out = subprocess.run([psql, "-X", "-A", "-t", "-d", db.conninfo, "-f", "-"], input=script.stdout,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "cliPlain||" in out.stdout and "|covered|" in out.stdout


def test_a_select_only_role_suffices(db, workers, harness):
    start(workers, db, "plain")
    role = f"cov_{db.name}"[:60]
    conn = db.connect()
    grants = (f'CREATE ROLE "{role}" LOGIN', f'GRANT USAGE ON SCHEMA pgflow, pgmq TO "{role}"',
              f'GRANT SELECT ON ALL TABLES IN SCHEMA pgflow, pgmq TO "{role}"')
    try:
        for statement in grants:
            conn.execute(statement)
        result = run_cli("coverage", "--dsn", f"{db.conninfo} user={role}", "--format", "json")
        assert result.code == 0, result.output
        assert json.loads(result.stdout)["routes"][0]["backlog"] == 0
    finally:
        conn.execute(f'DROP OWNED BY "{role}"')
        conn.execute(f'DROP ROLE "{role}"')


def test_report_helpers_without_a_database():
    assert coverage_op.STATES[0] == "covered"
    assert "%(" not in coverage_op.psql_script(None, 15)

"""`pgflow worker MODULE:FLOW`: refusals before any database access, a real run, a graceful stop
on SIGTERM, and the database's startup refusals as exit codes."""

from __future__ import annotations

import signal

import pytest

from tests.stage2.helpers import FLOWS, CliWorker, flow_target
from tests.support.cli import run_cli
from tests.worker.helpers import wait_until

NOWHERE = "host=/nonexistent/pgflow-test port=1 connect_timeout=1"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["tests.stage2.flows_module"], "expected MODULE:FLOW"),
        (["no_such_module_xyz:flow"], "cannot import module 'no_such_module_xyz'"),
        (["/nonexistent/flows.py:flow"], "no such file"),
        ([f"{FLOWS}:missing"], "has no attribute 'missing'"),
        ([f"{FLOWS}:not_a_flow"], "is a dict, not a Flow"),
        ([f"{FLOWS}:plain", "--step", "first"], "is a plain flow"),
        ([f"{FLOWS}:queued"], "serves exactly one step"),
        (["tests.stage2.flows_module:queued", "--step", "third"], "has no step 'third'"),
    ],
)
def test_refusals_happen_before_any_database_access(args, needle):
    result = run_cli("worker", *args, "--dsn", NOWHERE)
    assert result.code == 2, result.output
    assert needle in result.stderr
    assert "Traceback" not in result.stderr


def test_attribute_refusal_lists_the_flows_of_the_module():
    result = run_cli("worker", f"{FLOWS}:missing", "--dsn", NOWHERE)
    assert "flows it defines: async_blocking, blocking, failing, plain, queued" in result.stderr


def test_unreachable_database_is_exit_3():
    result = run_cli("worker", flow_target("plain"), "--dsn", NOWHERE)
    assert result.code == 3, result.output


def test_plain_flow_worker_runs_and_stops_on_sigterm(db):
    conn = db.connect()
    proc = CliWorker.start(db.conninfo, flow_target("plain"), "--worker-version", "release-7")
    try:
        worker_id = proc.wait_started()
        started = proc.wait_for_line(" started: flow=", which="stderr")
        assert "flow=cliPlain step=- queue=cliplain function=cliPlain-worker" in started
        run_id = conn.execute("SELECT run_id FROM pgflow.start_flow('cliPlain', '{\"x\": 1}')").fetchone()[0]
        wait_until(lambda: conn.execute("SELECT status FROM pgflow.runs WHERE run_id = %s", (run_id,)).fetchone()[0]
                   == "completed", "the run to complete")
        row = conn.execute("SELECT flow_slug, step_slug, queue_name, function_name FROM pgflow.workers "
                           "WHERE worker_id = %s", (worker_id,)).fetchone()
        assert row == ("cliPlain", None, "cliplain", "cliPlain-worker")
        proc.signal(signal.SIGTERM)
        assert proc.wait_exit() == 0
        assert conn.execute("SELECT stopped_at IS NOT NULL FROM pgflow.workers WHERE worker_id = %s",
                            (worker_id,)).fetchone()[0]
        assert any("received SIGTERM" in line for line in proc.lines("stderr"))
    finally:
        proc.kill()


def test_fenced_function_is_refused_with_exit_6(db):
    conn = db.connect()
    conn.execute("INSERT INTO pgflow.worker_functions (function_name, enabled) VALUES ('cliPlain-worker', false)")
    result = run_cli("worker", flow_target("plain"), "--dsn", db.conninfo)
    assert result.code == 6, result.output
    assert "is disabled" in result.stderr and "cliPlain-worker" in result.stderr
    assert conn.execute("SELECT count(*) FROM pgflow.flows").fetchone()[0] == 0  # refused before compiling
    assert conn.execute("SELECT count(*) FROM pgflow.workers").fetchone()[0] == 0


def test_shape_mismatch_is_refused_with_exit_6(db):
    conn = db.connect()
    conn.execute("SELECT pgflow.create_flow('cliPlain')")
    conn.execute("SELECT pgflow.add_step('cliPlain', 'other')")
    result = run_cli("worker", flow_target("plain"), "--dsn", db.conninfo)
    assert result.code == 6, result.output
    assert "exists in the database with a different shape" in result.stderr
    assert conn.execute("SELECT count(*) FROM pgflow.workers").fetchone()[0] == 0


def test_protocol_mismatch_is_refused_with_exit_6(baseline_db):
    result = run_cli("worker", flow_target("plain"), "--dsn", baseline_db.conninfo)
    assert result.code == 6, result.output
    assert "protocol" in result.stderr

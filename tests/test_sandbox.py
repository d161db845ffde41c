"""`pgflow sandbox` end to end: the README's first command on a private sandbox directory."""

from __future__ import annotations

import json
import os

import psycopg
import pytest

from pgflow_cli.errors import ExitCode
from tests.support.cli import run_cli


@pytest.fixture(scope="module")
def sandbox_env(tmp_path_factory):
    # Short, postgres-accessible path (the server runs as 'postgres' when we are root).
    import tempfile

    base = tempfile.mkdtemp(prefix="pgflow-sbx-", dir="/tmp")
    os.chmod(base, 0o755)
    env = {"PGFLOW_SANDBOX_DIR": os.path.join(base, "sandbox")}
    yield env
    run_cli("sandbox", "reset", "--destroy", "--yes", env=env)
    import shutil

    shutil.rmtree(base, ignore_errors=True)


def test_seeded_sandbox_audit_has_the_demo_findings(sandbox_env):
    up = run_cli("sandbox", "up", "--seed", "demo", env=sandbox_env)
    assert up.code == ExitCode.OK, up.output
    assert "schema version: 0002" in up.stdout
    assert "loaded seed 'demo'" in up.stderr

    audit = run_cli("audit", "--sandbox", "--format", "json", env=sandbox_env)
    assert audit.code == ExitCode.FINDINGS, audit.stderr
    doc = json.loads(audit.stdout)
    blocking = sorted((f["check_id"], f["object_name"]) for f in doc["findings"] if f["blocking"])
    assert blocking == [
        ("flow_slug_case_conflict", "Billing"),
        ("flow_slug_case_conflict", "billing"),
        ("flow_slug_rejected", "_legacyImport"),
        ("flow_slug_rejected", "report__daily"),
        ("queue_alias_conflict", "Billing"),
        ("queue_alias_conflict", "billing"),
        ("step_slug_case_conflict", "LoadData"),
        ("step_slug_case_conflict", "loadData"),
        ("step_slug_rejected", "render_"),
    ]
    impact = {f["flow_slug"]: f for f in doc["flows"]}
    assert impact["greetUser"]["active_runs"] == 3 and impact["greetUser"]["total_runs"] == 7
    assert impact["processOrder"]["started_tasks"] == 1  # claimed by the demo's vanished worker


def test_seed_states_and_idempotence(sandbox_env):
    status = run_cli("sandbox", "status", "--format", "json", env=sandbox_env)
    info = json.loads(status.stdout)
    assert info["running"] and info["flows"] == 7 and info["runs_in_flight"] == 10
    with psycopg.connect(info["conninfo"]) as conn:
        states = dict(conn.execute("SELECT status, count(*) FROM pgflow.runs GROUP BY status").fetchall())
    assert states == {"completed": 7, "failed": 2, "started": 10}
    again = run_cli("sandbox", "up", "--seed", "demo", env=sandbox_env)
    assert again.code == ExitCode.OK and "not loaded again" in again.stderr


def test_demo_workers_finish_the_runnable_runs(sandbox_env):
    info = json.loads(run_cli("sandbox", "status", "--format", "json", env=sandbox_env).stdout)
    with psycopg.connect(info["conninfo"], autocommit=True) as conn:
        # make the vanished worker's claim stale so recovery hands it back (as 90 s of waiting would)
        conn.execute("UPDATE pgflow.step_tasks SET queued_at = now() - interval '11 minutes', started_at = now() - interval '10 minutes' WHERE status = 'started'")
    result = run_cli("sandbox", "worker", "--seconds", "4", env=sandbox_env, timeout=60)
    assert result.code == ExitCode.OK, result.stderr
    with psycopg.connect(info["conninfo"]) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pgflow.runs WHERE status = 'started' AND flow_slug IN ('greetUser', 'processOrder')"
        ).fetchone()[0]
    assert left == 0


def test_dsn_and_down(sandbox_env):
    dsn = run_cli("sandbox", "dsn", env=sandbox_env)
    assert dsn.code == 0 and "dbname=pgflow" in dsn.stdout and "password" not in dsn.stdout
    down = run_cli("sandbox", "down", env=sandbox_env)
    assert down.code == 0
    assert run_cli("audit", "--sandbox", env=sandbox_env).code == ExitCode.CONNECTION
    assert run_cli("sandbox", "up", env=sandbox_env).code == ExitCode.OK  # restarts with its data


def test_unknown_seed_is_usage_error(sandbox_env):
    result = run_cli("sandbox", "up", "--seed", "nope", env=sandbox_env)
    assert result.code == ExitCode.USAGE and "unknown seed" in result.stderr


def test_reset_needs_confirmation_off_a_terminal(sandbox_env):
    result = run_cli("sandbox", "reset", env=sandbox_env)
    assert result.code == ExitCode.USAGE and "--yes" in result.stderr

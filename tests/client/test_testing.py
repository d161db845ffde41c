"""pgflow_cli.testing: application tests run a flow to completion on a throwaway database built by the
real installer. The documented example (examples/testing) runs as written, on an existing server and
on a private one; run_flow itself is exercised on step-queued flows, failures and a run that never ends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from pgflow_cli.client import WaitTimeout
from pgflow_cli.testing import ThrowawayServer, run_flow
from pgflow_cli.worker import Flow, with_step_queues

REPO = Path(__file__).resolve().parents[2]


def _pytest_example(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "PYTEST_")) and k != "DATABASE_URL"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "examples/testing"],
                          cwd=REPO, env={**clean, **env}, capture_output=True, text=True, timeout=600)


def _databases(harness) -> set[str]:
    return {row[0] for row in harness.admin.execute("SELECT datname FROM pg_database WHERE datname LIKE 'pgflow_test_%'")}


def test_the_documented_example_passes_on_an_existing_server_and_leaves_nothing_behind(harness):
    before = _databases(harness)
    done = _pytest_example({"PGFLOW_TEST_ADMIN_DSN": harness.server.conninfo("postgres")})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
    assert _databases(harness) == before  # every test database and the template dropped


@pytest.mark.slow
def test_the_documented_example_passes_on_a_private_server_of_its_own():
    done = _pytest_example({})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout


@pytest.fixture(scope="module")
def throwaway(harness):
    server = ThrowawayServer.existing(harness.server.conninfo("postgres"))
    yield server
    server.close()


def test_a_step_queued_flow_runs_with_one_worker_per_step(throwaway):
    flow = with_step_queues(Flow("split")
                            .step("words", lambda text, ctx: text["text"].split())
                            .map("lengths", lambda word, ctx: len(word), array="words")
                            .step("total", lambda deps, ctx: sum(deps["lengths"]), depends_on=["lengths"]))
    with throwaway.database() as database:
        result = run_flow(flow, {"text": "the quick brown fox"}, database)
        with psycopg.connect(database.conninfo) as conn:
            queues = {row[0] for row in conn.execute("SELECT queue_name FROM pgflow.workers")}
    assert result.raise_for_failure().step_outputs == {"words": ["the", "quick", "brown", "fox"],
                                                       "lengths": [3, 5, 5, 3], "total": 16}
    assert result.output == {"total": 16} and queues == set(flow.routes.values())


def test_a_failure_is_returned_and_raised_on_request(throwaway):
    def refuse(value, ctx):
        raise PermissionError("no")

    flow = Flow("refusing", max_attempts=1).step("first", lambda v, c: v).step("check", refuse, depends_on=["first"])
    with throwaway.database() as database:
        result = run_flow(flow, {"x": 1}, database)
    assert result.status == "failed" and result.output is None
    assert result.step_outputs == {"first": {"x": 1}}  # what completed before the failure
    assert result.state.step("check").status == "failed"
    with pytest.raises(type(result.failure)) as raised:
        result.raise_for_failure()
    assert raised.value.failures[0].tasks[0].error_message == "PermissionError: no"


def test_a_run_that_never_ends_is_a_wait_timeout_and_the_workers_stop(throwaway):
    flow = Flow("waitsForAnApproval").step("approve", manual=True).step("go", lambda d, c: 1, depends_on=["approve"])
    with throwaway.database() as database:
        with pytest.raises(WaitTimeout):
            run_flow(flow, {}, database, timeout=0.5)
        with psycopg.connect(database.conninfo) as conn:
            stopped = conn.execute("SELECT count(*), count(stopped_at) FROM pgflow.workers").fetchone()
    assert stopped == (1, 1)


def test_databases_are_separate(throwaway):
    flow = Flow("counted").step("one", lambda v, c: 1)
    with throwaway.database() as first, throwaway.database() as second:
        run_flow(flow, {}, first)
        with psycopg.connect(second.conninfo) as conn:
            assert conn.execute("SELECT count(*) FROM pgflow.runs").fetchone()[0] == 0

"""Workers, the run client's commands and every read-only command work through a real PgBouncer in
transaction mode (strict: every server connection is reset after each transaction).

Two ``pgflow worker`` processes serve the test flows through the pooler; every command below talks to
the pooler too, and reports what the same command reports on a direct connection. The commands that
look again and again on one connection (``coverage --wait``, ``runs wait``) are among them: a
statement prepared on the server would be unknown to the next server connection.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgflow_cli.errors import ExitCode
from tests.client.flows import compile_flows, failing, greet, held
from tests.support.cli import CliResult, run_cli
from tests.support.schemas import validate_kind
from tests.worker.helpers import DEADLINE, wait_until

REPO = Path(__file__).resolve().parents[2]


CLOCK_FIELDS = {"age_seconds", "oldest_message_age_seconds", "last_heartbeat_age_seconds", "heartbeat_age_seconds",
                "duration_ms", "checked_at", "last_heartbeat_at"}
"""Fields that change between two looks (seconds since something, how long a look took)."""


def _comparable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items() if k not in CLOCK_FIELDS}
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


def _json(result: CliResult) -> dict[str, Any]:
    """The command's JSON document, checked against its schema, without ``database`` (where it
    connected: the pooler, or the server) and the clock fields."""
    assert result.code in (ExitCode.OK, ExitCode.FINDINGS), result.output
    document = json.loads(result.stdout)
    validate_kind(document)
    document.pop("database", None)
    return dict(_comparable(document))


class Both:
    """The same command through the pooler and directly."""

    def __init__(self, pooled, db) -> None:
        self.pooled = pooled.conninfo
        self.direct = db.conninfo

    def pooler(self, *args: str) -> CliResult:
        return run_cli(*args, "--dsn", self.pooled)

    def same(self, *args: str) -> dict[str, Any]:
        """Run ``args`` with ``--format json`` both ways; the two documents must be equal."""
        through = _json(self.pooler(*args, "--format", "json"))
        direct = _json(run_cli(*args, "--format", "json", "--dsn", self.direct))
        assert through == direct, (args, through, direct)
        return through


class WorkerProcesses:
    """``pgflow worker tests.client.flows:NAME`` processes (the real command), stopped with SIGTERM."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, flow_name: str, dsn: str) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "DATABASE_URL"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgflow_cli", "worker", f"tests.client.flows:{flow_name}", "--dsn", dsn,
             "--heartbeat-interval", "0.5", "--concurrency", "4"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def stop(self) -> list[tuple[int, str]]:
        """SIGTERM every process; their exit codes and stderr."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        ended = []
        for proc in self.procs:
            try:
                _, err = proc.communicate(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            ended.append((proc.returncode, err))
        self.procs.clear()
        return ended


@pytest.fixture
def workers():
    processes = WorkerProcesses()
    yield processes
    processes.stop()


def _live_workers(db, function_name: str) -> bool:
    with psycopg.connect(db.conninfo) as conn:
        row = conn.execute("SELECT count(*) FROM pgflow.workers WHERE function_name = %s AND stopped_at IS NULL",
                           (function_name,)).fetchone()
        return bool(row and row[0])


def test_workers_and_every_read_only_command_through_pgbouncer(db, pooled, workers):
    compile_flows(db.conninfo, greet, held, failing)
    workers.start("greet", pooled.conninfo)
    workers.start("held", pooled.conninfo)
    for function_name in ("greetUser-worker", "held-worker"):
        wait_until(lambda f=function_name: _live_workers(db, f), f"{function_name} to register through the pooler")
    both = Both(pooled, db)

    # the run client's commands: start and wait, a completed run
    started = both.pooler("runs", "start", "greetUser", "-i", '{"first": "Ada", "last": "Lovelace"}', "--wait",
                          "--show-output", "--format", "json")
    assert started.code == ExitCode.OK, started.output
    assert json.loads(started.stdout)["wait"]["output"] == {"greeting": "Hello, Ada Lovelace!"}
    held_runs = [json.loads(both.pooler("runs", "start", "held", "-i", json.dumps({"n": n}), "--format", "json")
                            .stdout)["run"]["run_id"] for n in range(2)]

    # read-only views: the same documents as on a direct connection
    listed = both.same("runs", "list")
    assert {r["flow_slug"] for r in listed["runs"]} == {"greetUser", "held"}
    both.same("runs", "show", held_runs[0][:8])
    tasks = both.same("task", "list")
    assert sorted(t["run_id"] for t in tasks["tasks"]) == sorted(held_runs)
    both.same("task", "show", held_runs[0][:8], "approve")
    both.same("audit")
    covered = both.same("coverage", "--flow", "greetUser", "--flow", "held")
    assert covered["summary"]["covered"] is True, covered
    for args in (["status"], ["fence", "status"], ["migrate", "status"], ["migrate", "plan"]):
        result = both.pooler(*args, "--format", "json")
        assert result.code == ExitCode.OK, (args, result.output)
        validate_kind(json.loads(result.stdout))

    # looking again and again on one connection: no route of `failing` has a worker, so --wait runs out
    waited = both.pooler("coverage", "--flow", "failing", "--wait", "--timeout", "2", "--interval", "0.1")
    assert waited.code == ExitCode.DEADLINE, waited.output

    # manual tasks completed and failed through the pooler; the held worker finishes the first run
    completed = both.pooler("task", "complete", held_runs[0][:8], "approve", "--output", '"yes"')
    assert completed.code == ExitCode.OK, completed.output
    failed = both.pooler("task", "fail", held_runs[1], "approve", "--error", "no")
    assert failed.code == ExitCode.OK, failed.output
    assert both.pooler("runs", "wait", held_runs[0], "--timeout", str(DEADLINE)).code == ExitCode.OK
    assert both.pooler("runs", "wait", held_runs[1], "--timeout", str(DEADLINE)).code == ExitCode.FINDINGS

    # the workers stop cleanly, and every queue task ran exactly once
    assert [code for code, _ in workers.stop()] == [0, 0]
    with psycopg.connect(db.conninfo) as conn:
        rows = conn.execute("SELECT flow_slug, step_slug, status, attempts_count FROM pgflow.step_tasks "
                            "WHERE step_slug <> 'approve' ORDER BY 1, 2").fetchall()
        assert rows == [("greetUser", "fullName", "completed", 1), ("greetUser", "greeting", "completed", 1),
                        ("held", "after", "completed", 1)]
        assert conn.execute("SELECT count(*) FROM pgflow.workers WHERE stopped_at IS NULL").fetchone() == (0,)


def test_the_run_client_through_pgbouncer_starts_and_awaits_many_runs(db, pooled):
    from pgflow_cli.client import Client
    from pgflow_cli.worker import Worker, WorkerOptions
    from tests.worker.helpers import FAST, stop_and_join

    worker = Worker(greet, pooled.conninfo, function_name="greetUser-worker", options=WorkerOptions(**FAST))
    worker.start()
    try:
        with Client(pooled.conninfo) as client:
            runs = client.start_many(greet, [{"first": str(n), "last": "x"} for n in range(30)])
            outcomes = list(client.as_completed(runs, timeout=DEADLINE))
        assert sorted(o.output["greeting"] for o in outcomes) == sorted(f"Hello, {n} x!" for n in range(30))
        assert {str(o.run_id) for o in outcomes} == {str(r.run_id) for r in runs}
    finally:
        stop_and_join([worker])
    assert uuid.UUID(str(runs[0].run_id))

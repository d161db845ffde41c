"""Waiting at scale and across a server restart, on a dedicated server (pg_stat_statements loaded; one
this module may stop and start without touching the suite's shared server).

The statement count per waited run is the server's own: ``pg_stat_statements`` calls of the client's
poll statement (its text is the client's alone) after a reset, divided by the runs awaited."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import pytest

from pgflow_cli import installer
from pgflow_cli.client import AsyncClient, Client, PollPolicy, start_runs
from pgflow_cli.errors import ConnectionFailed
from pgflow_cli.sandbox.embedded import LocalServer
from pgflow_cli.worker import Flow, Worker, WorkerOptions
from tests.client.flows import compile_flows
from tests.worker.helpers import FAST, stop_and_join

pytestmark = pytest.mark.slow

RUNS = 1000

quick = Flow("quick").step("echo", lambda value, ctx: value["n"])
gate = Flow("gate").step("approve", manual=True)
"""A run of ``gate`` ends when its one manual task is completed: a hold with no timing in it."""


@pytest.fixture(scope="module")
def server():
    """A private server with pg_stat_statements, and one database with PGMQ and the pgflow schema."""
    base = Path(tempfile.mkdtemp(prefix="pgflow-i26w-", dir="/tmp"))
    os.chmod(base, 0o755)
    local = LocalServer(base / "pg", settings={"shared_preload_libraries": "pg_stat_statements",
                                               "pg_stat_statements.track": "top"})
    try:
        local.start()
        local.wait_ready()
        with psycopg.connect(local.conninfo("postgres"), autocommit=True) as admin:
            admin.execute("CREATE DATABASE waits")
        with psycopg.connect(local.conninfo("waits"), autocommit=True) as conn:
            installer.install(conn)
            conn.execute("CREATE EXTENSION pg_stat_statements")
        yield local
    finally:
        local.destroy()
        shutil.rmtree(base, ignore_errors=True)


def _running(local: LocalServer) -> LocalServer:
    """The server, started again if a test left it stopped."""
    if not local.is_running():
        local.start()
        local.wait_ready()
    return local


def _until(condition, deadline: float = 120.0) -> None:
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, "the state was not reached"
        time.sleep(0.01)


def _poll_calls(conninfo: str) -> int:
    with psycopg.connect(conninfo) as conn:
        return conn.execute("SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements "
                            "WHERE query LIKE '%%FROM pgflow.runs AS r%%WHERE r.run_id = ANY%%'").fetchone()[0]


def test_one_client_process_awaits_1000_runs_with_few_statements_per_run(server):
    conninfo = _running(server).conninfo("waits")
    compile_flows(conninfo, quick)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        runs = start_runs(conn, quick, [{"n": i} for i in range(RUNS)])
        conn.execute("SELECT pg_stat_statements_reset()")
    worker = Worker(quick, conninfo, function_name="quick-worker",
                    options=WorkerOptions(**{**FAST, "batch_size": 50, "max_concurrent": 20}))

    async def await_all():
        async with AsyncClient(conninfo) as pgflow:  # the default policy: 0.05 s growing 1.5x to 2 s
            began = time.monotonic()
            waits = asyncio.gather(*(pgflow.wait(run, timeout=300) for run in runs))
            while pgflow.stats.polls < 1:  # every run awaited and read once before any can end
                await asyncio.sleep(0.01)
            await asyncio.get_running_loop().run_in_executor(None, worker.start)
            return await waits, pgflow.stats, time.monotonic() - began

    try:
        outputs, stats, seconds = asyncio.run(await_all())
    finally:
        stop_and_join([worker])
    assert outputs == [{"echo": i} for i in range(RUNS)]
    calls = _poll_calls(conninfo)
    assert calls == stats.polls  # the server saw exactly the client's statements
    per_run = calls / RUNS
    print(f"\n{RUNS} runs awaited in {seconds:.1f} s by one process: {calls} poll statements "
          f"({per_run:.3f} per waited run), each run read {stats.runs_read / RUNS:.1f} times; load {os.getloadavg()}")
    assert per_run < 0.1, stats  # one statement per look for every run due, not one per run


def test_a_waiter_reconnects_across_a_server_restart(server):
    conninfo = _running(server).conninfo("waits")
    compile_flows(conninfo, gate)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        run_id = str(conn.execute("SELECT run_id FROM pgflow.start_flow('gate', '{}')").fetchone()[0])
    with Client(conninfo, poll=PollPolicy(first_interval=0.05, max_interval=0.2, reconnect_timeout=60)) as pgflow:
        results: list = []
        waiter = threading.Thread(target=lambda: results.append(pgflow.outcome(run_id, timeout=300)))
        waiter.start()
        _until(lambda: pgflow.stats.polls >= 1)
        server.stop(mode="fast")  # every connection is closed; nothing listens
        server.start()
        _until(lambda: pgflow.stats.reconnects >= 1)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("SELECT pgflow.complete_manual_task(%s, 'approve', 0, '\"after the restart\"')", (run_id,))
        waiter.join(120)
    [outcome] = results
    assert outcome.ok and outcome.output == {"approve": "after the restart"}


def test_a_waiter_whose_server_stays_down_fails_with_a_clear_error(server):
    conninfo = _running(server).conninfo("waits")
    compile_flows(conninfo, gate)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        run_id = str(conn.execute("SELECT run_id FROM pgflow.start_flow('gate', '{}')").fetchone()[0])
    try:
        with Client(conninfo, poll=PollPolicy(first_interval=0.05, max_interval=0.2, reconnect_timeout=1.0)) as pgflow:
            errors: list[BaseException] = []

            def wait() -> None:
                try:
                    pgflow.outcome(run_id, timeout=300)
                except BaseException as exc:  # the test inspects it
                    errors.append(exc)

            waiter = threading.Thread(target=wait)
            waiter.start()
            _until(lambda: pgflow.stats.polls >= 1)
            server.stop(mode="fast")
            waiter.join(120)
    finally:
        _running(server)
    [error] = errors
    assert isinstance(error, ConnectionFailed)
    assert error.message.startswith("lost the connection to ") and "could not reconnect within 1 s" in error.message
    assert "pgflow runs wait" in error.hint


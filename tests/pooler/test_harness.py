"""The tests' PgBouncer is what the pooler tests say it is: a real PgBouncer in transaction mode that
resets every server connection after each transaction (``strict``), so code that relies on session
state fails there every time, not only when the pooler happens to switch server connections."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg import errors as pgerrors

from tests.worker.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]


def test_session_state_never_survives_a_transaction_through_the_strict_pooler(pooled):
    conn = pooled.connect()
    conn.execute("SET application_name = 'kept'")  # tracked by PgBouncer itself: it follows the client
    conn.execute("SET work_mem = '7MB'")  # session state of one server connection
    assert conn.execute("SHOW work_mem").fetchone() != ("7MB",)
    conn.execute("SELECT pg_advisory_lock(42)")
    assert conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 42").fetchone() == (0,)
    assert conn.execute("SHOW application_name").fetchone() == ("kept",)


def test_a_prepared_statement_is_unknown_when_it_is_used(pooled):
    """psycopg prepares a statement (by default once it ran 5 times on a connection) with a Parse message
    synced on its own, then executes it: two exchanges the pooler treats as two transactions."""
    assert pooled.connect().execute("SELECT 1").fetchone() == (1,)  # prepare_threshold=None: never prepared
    conn = pooled.connect(prepare_threshold=0)  # prepare every statement at once
    with pytest.raises(pgerrors.InvalidSqlStatementName):
        conn.execute("SELECT 1")


def test_the_pooler_multiplexes_clients_over_its_server_connections(pooled, pgbouncer):
    clients = [pooled.connect() for _ in range(pgbouncer.pool_size + 5)]
    with clients[0].transaction():
        pid = clients[0].execute("SELECT pg_backend_pid()").fetchone()
        assert all(c.info.backend_pid != pid[0] for c in clients)  # the pooler's own keys
    backends = {c.execute("SELECT pg_backend_pid()").fetchone()[0] for c in clients}
    assert len(backends) <= pgbouncer.pool_size  # more clients than server connections: they are shared
    with psycopg.connect(pooled.server.conninfo(pooled.name)) as direct:
        assert direct.info.backend_pid == direct.execute("SELECT pg_backend_pid()").fetchone()[0]


_STARTER = """
import signal, sys, tempfile
from pathlib import Path
from pgflow_cli.sandbox import LocalServer
from pgflow_cli.sandbox.pooler import LocalPooler
pooler = LocalPooler(Path(tempfile.mkdtemp(prefix="pgflow-pooler-orphan-", dir="/tmp")), LocalServer(Path(sys.argv[1])))
pooler.start()
print(pooler.pid, pooler.base_dir, flush=True)
signal.pause()  # alive until the test kills it
"""


def test_the_pooler_ends_when_the_process_that_started_it_is_killed(harness):
    """A crashed test worker or benchmark leaves no PgBouncer behind (its directory stays: /tmp)."""
    starter = subprocess.Popen([sys.executable, "-c", _STARTER, str(harness.server.base_dir)],
                               stdout=subprocess.PIPE, text=True, cwd=REPO)
    base_dir = ""
    try:
        assert starter.stdout is not None
        pid_text, base_dir = starter.stdout.readline().split()
        pid = int(pid_text)
        assert _alive(pid)
        starter.kill()
        starter.wait(30)
        wait_until(lambda: not _alive(pid), "the orphaned pgbouncer to end")
    finally:
        if starter.poll() is None:
            starter.kill()
        if base_dir:
            shutil.rmtree(base_dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        return b"pgbouncer" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False

"""The commands that need a server session of their own refuse a connection pooler, deterministically.

``migrate apply``, ``migrate abort``, ``fence disable`` and ``fence restore`` through the real
PgBouncer (transaction mode, over TCP and over its Unix socket) exit 2 before they read or change
anything, naming the pooler and the direct connection string; that connection string, pasted as it
is, then works. Direct connections over TCP and over the Unix socket are never taken for a pooler
(pgflow_cli/operations/pooler.py says how the two are told apart). A session-mode PgBouncer is
refused too: the client cannot tell its mode.
"""

from __future__ import annotations

import json
import re
import shlex
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgflow_cli import installer
from pgflow_cli.errors import ExitCode
from pgflow_cli.operations import pooler as pooler_op
from pgflow_cli.sandbox.pooler import LocalPooler
from tests.support.cli import run_cli

ROUTES = ["tcp", "socket"]


def _through(pgbouncer, database, route: str) -> str:
    return pgbouncer.conninfo(database.name, tcp=route == "tcp")


def _direct(database, route: str) -> str:
    server = database.server
    if route == "socket":
        return database.conninfo
    return make_conninfo(server.conninfo(database.name, tcp=True), password=server.config.password)


def _suggested_dsn(stderr: str) -> str:
    """The connection string the refusal's hint names (``--dsn '...'``), as a shell would read it."""
    match = re.search(r"--dsn ('[^']*'|\S+)", stderr)
    assert match, stderr
    return shlex.split(match.group(1))[0]


def _register(database, function_name: str) -> None:
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        conn.execute("SELECT pgflow.register_worker(%s, %s, 'some_queue', NULL, NULL)", (uuid.uuid4(), function_name))


@pytest.mark.parametrize("route", ROUTES)
def test_a_direct_connection_is_a_session_of_its_own(db, route):
    with psycopg.connect(_direct(db, route), autocommit=True) as conn:
        assert (conn.info.host.startswith("/")) == (route == "socket")
        assert pooler_op.evidence(conn) is None


@pytest.mark.parametrize("route", ROUTES)
def test_pgbouncer_is_seen_with_where_it_reaches_the_server(db, pgbouncer, route):
    with psycopg.connect(_through(pgbouncer, db, route), autocommit=True, prepare_threshold=None) as conn:
        found = pooler_op.evidence(conn)
        assert found is not None
        assert found.announced_pid == conn.info.backend_pid != found.backend_pid
        # the test PgBouncer reaches the server over the server's own Unix socket
        assert (found.server_host, found.server_port) == (str(db.server.socket_dir), db.server.port)


@pytest.mark.parametrize("route", ROUTES)
def test_migrate_apply_through_pgbouncer_exits_2_changes_nothing_and_the_named_dsn_works(baseline_db, pgbouncer, route):
    def applied_versions() -> list[int]:
        with psycopg.connect(baseline_db.conninfo, autocommit=True) as conn:
            return [row[0] for row in conn.execute("SELECT version FROM pgflow.schema_migrations ORDER BY 1")]

    before = applied_versions()
    assert max(before) == installer.BASELINE_VERSION
    refused = run_cli("migrate", "apply", "--dsn", _through(pgbouncer, baseline_db, route))
    assert refused.code == ExitCode.USAGE, refused.output
    assert "pgflow migrate apply needs a PostgreSQL session of its own" in refused.stderr
    assert "is a connection pooler" in refused.stderr and "advisory lock" in refused.stderr
    assert pgbouncer.server.config.password not in refused.output
    assert applied_versions() == before
    direct = _suggested_dsn(refused.stderr)
    assert conninfo_to_dict(direct) == {"host": str(baseline_db.server.socket_dir), "port": str(baseline_db.server.port),
                                        "dbname": baseline_db.name, "user": "postgres"}
    applied = run_cli("migrate", "apply", "--dsn", direct)
    assert applied.code == ExitCode.OK, applied.output
    assert max(applied_versions()) > installer.BASELINE_VERSION


@pytest.mark.parametrize("route", ROUTES)
def test_direct_connections_migrate_and_fence_as_before(db, route):
    dsn = _direct(db, route)
    applied = run_cli("migrate", "apply", "--dsn", dsn, "--format", "plain")
    assert applied.code == ExitCode.OK, applied.output
    assert "nothing to apply" in applied.stdout
    _register(db, "direct-fn")
    fenced = run_cli("fence", "disable", "--function", "direct-fn", "-m", "test", "--detach", "--dsn", dsn)
    assert fenced.code == ExitCode.OK, fenced.output
    restored = run_cli("fence", "restore", "--function", "direct-fn", "--dsn", dsn)
    assert restored.code == ExitCode.OK, restored.output
    aborted = run_cli("migrate", "abort", "3", "--yes", "--dsn", dsn)
    assert aborted.code == ExitCode.CONFLICT, aborted.output  # not in progress: it got as far as looking


@pytest.mark.parametrize("route", ROUTES)
def test_fence_disable_restore_and_migrate_abort_through_pgbouncer_exit_2_before_anything(db, pgbouncer, route):
    _register(db, "pooled-fn")
    dsn = _through(pgbouncer, db, route)
    for args in (["fence", "disable", "--function", "pooled-fn", "-m", "rollout", "--detach"],
                 ["fence", "restore", "--function", "pooled-fn"],
                 ["migrate", "abort", "3", "--yes"]):
        result = run_cli(*args, "--dsn", dsn)
        assert result.code == ExitCode.USAGE, (args, result.output)
        assert f"pgflow {args[0]} {args[1]} needs a PostgreSQL session of its own" in result.stderr
        assert conninfo_to_dict(_suggested_dsn(result.stderr))["host"] == str(db.server.socket_dir)
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        assert conn.execute("SELECT enabled FROM pgflow.worker_functions WHERE function_name = 'pooled-fn'"
                            ).fetchone() == (True,)
        assert conn.execute("SELECT count(*) FROM pgflow.fences").fetchone() == (0,)


def test_the_refusal_as_json_names_exit_2_and_the_evidence(db, pgbouncer):
    result = run_cli("migrate", "apply", "--dsn", pgbouncer.conninfo(db.name), "--format", "json")
    assert result.code == ExitCode.USAGE and result.stdout == ""
    error = json.loads(result.stderr)
    assert error["exit_code"] == 2 and "connection pooler" in error["message"]
    assert any("server process" in line for line in error["detail"])
    assert "--dsn " in error["hint"]


def test_read_only_migrate_commands_work_through_pgbouncer(db, pgbouncer):
    dsn = pgbouncer.conninfo(db.name)
    for args in (["migrate", "status"], ["migrate", "plan"], ["migrate", "apply", "--sql"]):
        result = run_cli(*args, "--dsn", dsn)
        assert result.code == ExitCode.OK, (args, result.output)


def test_a_session_mode_pgbouncer_is_refused_too(db):
    base = Path(tempfile.mkdtemp(prefix="pgflow-pooler-session-", dir="/tmp"))
    session_pooler = LocalPooler(base, db.server, pool_mode="session", pool_size=2)
    try:
        session_pooler.start()
        with psycopg.connect(session_pooler.conninfo(db.name), autocommit=True) as conn:
            assert pooler_op.evidence(conn) is not None
        result = run_cli("migrate", "apply", "--dsn", session_pooler.conninfo(db.name))
        assert result.code == ExitCode.USAGE, result.output
    finally:
        session_pooler.destroy()

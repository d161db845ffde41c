"""Connection failures are classified by SQLSTATE and libpq's connection state, never by message
text: a server answering in German maps exactly like an English one, and every connection of the
package (CLI, sandbox, seeds, demo, reference worker) goes through ``pgflow_cli.db.connect``."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from pgflow_cli import db
from pgflow_cli.errors import ConnectionFailed, ExitCode
from pgflow_cli.sandbox import LocalServer
from pgflow_cli.worker import Flow, Worker, WorkerOptions
from tests.support.cli import run_cli

PACKAGE = Path(__file__).resolve().parent.parent / "pgflow_cli"


@pytest.fixture(scope="module")
def german_server():
    """A server whose messages are German (gettext LANGUAGE=de; no OS locale needed)."""
    base = Path(tempfile.mkdtemp(prefix="pgflow-de-", dir="/tmp"))
    os.chmod(base, 0o755)
    server = LocalServer(base / "pg", tcp=True, settings={"lc_messages": "'C.UTF-8'"})
    previous = os.environ.get("LANGUAGE")
    os.environ["LANGUAGE"] = "de"
    try:
        server.start()
    finally:
        if previous is None:
            os.environ.pop("LANGUAGE", None)
        else:
            os.environ["LANGUAGE"] = previous
    server.wait_ready()
    yield server
    server.destroy()
    shutil.rmtree(base, ignore_errors=True)


def _cli_audit(conninfo: str, *extra: str):
    return run_cli("audit", "--dsn", conninfo, *extra)


def test_a_missing_database_on_a_german_server_is_3D000(german_server):
    result = _cli_audit(german_server.conninfo("keine_datenbank"))
    assert result.code == ExitCode.CONNECTION, result.output
    assert "existiert nicht" in result.stderr  # the server really answered in German
    assert "the database does not exist" in result.stderr
    assert "check the database name" in result.stderr


def test_a_wrong_password_on_a_german_server_is_an_authentication_failure(german_server):
    result = _cli_audit(german_server.conninfo("postgres", tcp=True) + " password=wrong-password")
    assert result.code == ExitCode.CONNECTION, result.output
    assert "fehlgeschlagen" in result.stderr
    assert "authentication failed" in result.stderr
    assert "wrong-password" not in result.output


def test_an_unknown_role_on_a_german_server_is_refused_by_sqlstate(german_server):
    result = _cli_audit(german_server.conninfo("postgres") + " user=niemand")
    assert result.code == ExitCode.CONNECTION, result.output
    assert "existiert nicht" in result.stderr  # the server really answered in German
    assert "the role does not exist" in result.stderr


def test_a_database_name_that_reads_like_a_libpq_complaint_is_not_a_usage_error(harness):
    # the old classifier matched "invalid ... value" anywhere in the text and answered exit 2
    result = _cli_audit(harness.server.conninfo("invalid port value"))
    assert result.code == ExitCode.CONNECTION, result.output
    assert "the database does not exist" in result.stderr


def test_an_invalid_option_value_is_refused_before_connecting():
    result = _cli_audit("host=/tmp port=not-a-port dbname=x")
    assert result.code == ExitCode.USAGE, result.output
    assert "invalid value for port" in result.stderr


@pytest.fixture
def silent_server():
    """A TCP port that accepts connections and never answers (an unresponsive server)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield listener.getsockname()[1]
    listener.close()


def test_an_unresponsive_server_times_out_in_the_cli(silent_server):
    started = time.monotonic()
    result = run_cli("audit", "--dsn", f"host=127.0.0.1 port={silent_server} dbname=x", "--connect-timeout", "1")
    assert result.code == ExitCode.CONNECTION, result.output
    assert "connection timed out" in result.stderr
    assert time.monotonic() - started < 60


def test_the_reference_worker_gets_the_connect_timeout_and_the_error_mapping(silent_server):
    worker = Worker(Flow("silentFlow").step("only", lambda v, ctx: v),
                    f"host=127.0.0.1 port={silent_server} dbname=x password=hunter2-secret",
                    function_name="silent-fn", options=WorkerOptions(connect_timeout=1))
    outcome: list[BaseException] = []

    def start() -> None:
        try:
            worker.start()
        except BaseException as exc:  # collected for the assertions below
            outcome.append(exc)

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the worker's startup connection had no connect timeout"
    [error] = outcome
    assert isinstance(error, ConnectionFailed) and error.exit_code == ExitCode.CONNECTION
    assert "connection timed out" in error.message and "hunter2-secret" not in error.message
    assert worker.state == "stopped"


def test_no_module_opens_a_connection_behind_db_connect():
    opened = re.compile(r"psycopg\.connect\(|ConnectionPool\(|Connection\.connect\(")
    offenders = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py")) if path.name != "db.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if opened.search(line) and not line.lstrip().startswith("#")
    ]
    pools = [o for o in offenders if "worker/runner.py" in o]
    assert [o for o in offenders if o not in pools] == []
    runner = (PACKAGE / "worker" / "runner.py").read_text()
    assert "ConnectionPool(\n            db.connection_string(" in runner  # the pool's conninfo comes from db too


def test_connect_keeps_the_documented_exit_codes(harness):
    with pytest.raises(ConnectionFailed):
        db.connect(db.Target(harness.server.conninfo("no_such_database"), "--dsn"))


def _json_error(result) -> dict:
    from tests.support.schemas import validate

    assert result.code == ExitCode.CONNECTION, result.output
    error = json.loads(result.stderr)
    validate(error, "error")
    return error


def test_a_missing_database_behind_a_password_is_not_a_wrong_password(harness):
    """The server checks the database only after the password: the verbose retry tells the two apart."""
    password = harness.server.config.password
    tcp = harness.server.conninfo("no_such_database", tcp=True)
    missing = _json_error(_cli_audit(f"{tcp} password={password}", "--format", "json"))
    assert missing["reason"] == "database_missing" and "no_such_database" in missing["message"]
    assert "password" not in missing["hint"]
    wrong = _json_error(_cli_audit(harness.server.conninfo("postgres", tcp=True) + " password=wrong-pw", "--format", "json"))
    assert wrong["reason"] == "wrong_password" and "wrong-pw" not in json.dumps(wrong)
    assert password not in json.dumps(missing)


def test_connection_failures_have_their_own_reasons(harness, tmp_path):
    none_given = _json_error(run_cli("audit", "--dsn", harness.server.conninfo("postgres", tcp=True), "--format",
                                     "json", env={"PGFLOW_NO_PASSWORD_PROMPT": "1"}))
    assert none_given["reason"] == "password_required" and "PGPASSWORD" in none_given["hint"]
    role = _json_error(_cli_audit(harness.server.conninfo("postgres") + " user=nobody_here", "--format", "json"))
    assert role["reason"] == "role_missing" and "nobody_here" in role["message"]
    with socket.socket() as sock:  # a port nothing listens on (bound, never listening)
        sock.bind(("127.0.0.1", 0))
        refused = _json_error(_cli_audit(f"host=127.0.0.1 port={sock.getsockname()[1]} dbname=x", "--format", "json"))
    assert refused["reason"] == "connection_refused" and "is the server running" in refused["hint"]
    no_socket = _json_error(_cli_audit(f"host={tmp_path} port=5432 dbname=x", "--format", "json"))
    assert no_socket["reason"] == "connection_refused"
    unknown = _json_error(_cli_audit("host=no-such-host.invalid dbname=x", "--format", "json"))
    assert unknown["reason"] == "host_unknown"
    assert len({e["reason"] for e in (none_given, role, refused, unknown)}) == 4
    assert all(e["kind"] == "pgflow-cli/error" and e["version"] == 2 for e in (none_given, role, refused, unknown))

"""Operator situations get a clear message and their documented exit code, never "internal error" (issue 14 item 8).

A hot standby (a real streaming replica of the test server) and a read-only session (exit 3), a
foreign ``pgflow.schema_migrations`` and a schema holding only some pgflow functions (exit 6), a
second migrator (named: pid, since), and ``--install-pgmq`` waiting for the migrator lock
before it looks at PGMQ.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import psycopg
import pytest
from psycopg import sql

from pgflow_cli import installer
from pgflow_cli.errors import ExitCode, StateConflict
from pgflow_cli.sandbox import free_port
from tests.support.cli import run_cli
from tests.support.fingerprint import fingerprint
from tests.support.levels import versions_after

MIGRATOR_LOCK = "SELECT pg_advisory_lock(1885824631, 0)"
MIGRATOR_UNLOCK = "SELECT pg_advisory_unlock(1885824631, 0)"


def _flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines


def _assert_operator_error(result, code: ExitCode, *phrases: str) -> None:
    assert result.code == code, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
    for phrase in phrases:
        assert phrase in _flat(result.stderr), result.stderr


@pytest.fixture
def standby(harness, baseline_db):
    """A real hot standby of the test server (pg_basebackup -R, streaming), holding ``baseline_db``."""
    server = harness.server
    base = harness.base / f"standby_{baseline_db.name}"
    base.mkdir()
    owner = os.stat(server.base_dir)
    os.chown(base, owner.st_uid, owner.st_gid)
    os.chmod(base, 0o700)
    data = base / "data"
    port = free_port()
    server._run([server._bin("pg_basebackup"), "-D", str(data), "-R", "-X", "stream", "-c", "fast",
                 "-h", str(server.socket_dir), "-p", str(server.port), "-U", server.config.superuser])
    started = server._run([server._bin("pg_ctl"), "start", "-D", str(data), "-l", str(base / "log"), "-w", "-t", "120",
                           "-o", f"-c port={port} -c listen_addresses='' -c unix_socket_directories='{base}' "
                           "-c hot_standby=on -c max_connections=200"], check=False)
    if started.returncode:
        log = (base / "log").read_text(errors="replace") if (base / "log").is_file() else started.stderr
        shutil.rmtree(base, ignore_errors=True)
        pytest.fail(f"the standby did not start: {log[-2000:]}")
    conninfo = psycopg.conninfo.make_conninfo(host=str(base), port=str(port), user=server.config.superuser,
                                              dbname=baseline_db.name)
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0] is True
        yield conninfo
    finally:
        server._run([server._bin("pg_ctl"), "stop", "-D", str(data), "-m", "immediate", "-w"], check=False)
        shutil.rmtree(base, ignore_errors=True)


def test_a_hot_standby_is_refused_with_exit_3(standby):
    result = run_cli("migrate", "apply", "--dsn", standby)
    _assert_operator_error(result, ExitCode.CONNECTION, "hot standby", "connect to the primary")
    online = run_cli("migrate", "apply", "--dsn", standby, "--online", "always")
    _assert_operator_error(online, ExitCode.CONNECTION, "hot standby")


def test_a_read_only_session_is_refused_with_exit_3(baseline_db, harness):
    before = fingerprint(baseline_db.conninfo)
    harness.admin.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(
        sql.Identifier(baseline_db.name)))
    for online in ("never", "always"):
        result = run_cli("migrate", "apply", "--dsn", baseline_db.conninfo, "--online", online)
        _assert_operator_error(result, ExitCode.CONNECTION, "read-only", "default_transaction_read_only")
    harness.admin.execute(sql.SQL("ALTER DATABASE {} RESET default_transaction_read_only").format(
        sql.Identifier(baseline_db.name)))
    assert fingerprint(baseline_db.conninfo).differences(before) == []
    per_session = run_cli("migrate", "apply", "--dsn", baseline_db.conninfo,
                          env={"PGOPTIONS": "-c default_transaction_read_only=on"})
    _assert_operator_error(per_session, ExitCode.CONNECTION, "read-only")


def test_a_foreign_ledger_table_is_a_conflict(empty_db):
    conn = empty_db.connect()
    installer.ensure_pgmq(conn)
    conn.execute("CREATE SCHEMA pgflow")
    conn.execute("CREATE TABLE pgflow.schema_migrations (id serial PRIMARY KEY, script text, run_on timestamptz)")
    for command in ("status", "plan", "apply"):
        result = run_cli("migrate", command, "--dsn", empty_db.conninfo)
        _assert_operator_error(result, ExitCode.CONFLICT, "not pgflow-cli's migration ledger", "columns found: id, script, run_on")


def test_a_schema_with_only_some_pgflow_functions_is_a_conflict(empty_db):
    conn = empty_db.connect()
    installer.ensure_pgmq(conn)
    conn.execute("CREATE SCHEMA pgflow")
    conn.execute("CREATE FUNCTION pgflow.is_local() RETURNS boolean LANGUAGE sql AS 'SELECT true'")
    result = run_cli("migrate", "apply", "--dsn", empty_db.conninfo)
    _assert_operator_error(result, ExitCode.CONFLICT, "partial installation", "1 function(s)")
    assert conn.execute("SELECT to_regclass('pgflow.flows')").fetchone()[0] is None


def test_a_second_migrator_is_told_who_holds_the_lock(baseline_db):
    holder = psycopg.connect(baseline_db.conninfo, autocommit=True, application_name="first-migrator")
    holder.execute(MIGRATOR_LOCK)
    conn = baseline_db.connect()
    with pytest.raises(StateConflict) as info:
        installer.apply(conn, lock_wait=0.5)
    message = info.value.message
    assert message.startswith("another migrator holds the lock: ")
    assert f"pid {holder.info.backend_pid} (first-migrator, user postgres), since " in message
    assert "--" not in info.value.hint  # no option to suggest: waiting for it is the fix
    holder.execute(MIGRATOR_UNLOCK)
    holder.close()
    assert [a.migration.version for a in installer.apply(conn)] == [3, *versions_after(3)]


def _start_waiting_migrator(database, *args: str) -> subprocess.Popen:
    """``pgflow migrate apply ARGS`` in a subprocess; returns once it says it waits for the migrator lock."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["COLUMNS"] = "400"
    proc = subprocess.Popen([sys.executable, "-m", "pgflow_cli", "migrate", "apply", "--dsn", database.conninfo, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if "another migrator holds the lock" in line:
            proc.waiting_line = line  # type: ignore[attr-defined]
            return proc
    proc.kill()
    raise AssertionError(f"the second migrator never said it waits: {''.join(lines)}")


def _while_another_migrator_holds_the_lock(database, check, *args: str) -> str:
    """Run ``migrate apply ARGS`` while a session holds the migrator lock; ``check(proc, holder)``
    runs once the CLI says it waits; then the lock is let go. Returns the CLI's stderr (exit 0)."""
    holder = psycopg.connect(database.conninfo, autocommit=True, application_name="first-migrator")
    holder.execute(MIGRATOR_LOCK)
    proc = _start_waiting_migrator(database, *args)
    try:
        check(proc, holder)
        holder.execute(MIGRATOR_UNLOCK)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        holder.close()
    assert proc.returncode == ExitCode.OK, err
    return err


def test_the_cli_names_the_migrator_it_waits_for(baseline_db):
    def named(proc, holder) -> None:
        assert f"pid {holder.info.backend_pid} (first-migrator, user postgres), since " in proc.waiting_line

    assert "applied 0003_queue_stage" in _while_another_migrator_holds_the_lock(baseline_db, named)


def test_install_pgmq_waits_for_the_migrator_lock_before_it_looks(empty_db):
    conn = empty_db.connect()

    def untouched(proc, holder) -> None:  # waiting for the lock, it has not looked at PGMQ yet
        assert conn.execute("SELECT to_regnamespace('pgmq')").fetchone()[0] is None

    err = _while_another_migrator_holds_the_lock(empty_db, untouched, "--install-pgmq")
    assert "installed PGMQ" in err
    assert conn.execute("SELECT to_regclass('pgmq.meta') IS NOT NULL").fetchone()[0]

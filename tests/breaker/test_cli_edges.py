"""CLI edges: option values at the limits, exit codes against docs/exit-codes.md, stdout/stderr discipline,
Ctrl-C."""

from __future__ import annotations

import json
import signal
import time

import psycopg
import pytest

from pgflow_cli import db as pgdb
from pgflow_cli.errors import ExitCode
from tests.breaker.conftest import popen_cli
from tests.support.cli import run_cli


@pytest.mark.parametrize("value", ["inf", "1e308"])
def test_infinite_statement_timeout_is_not_an_internal_error(db, value):
    result = run_cli("audit", "--dsn", db.conninfo, "--statement-timeout", value)
    assert result.code in (ExitCode.OK, ExitCode.USAGE), result.output
    assert "internal error" not in result.stderr


def test_a_tiny_positive_statement_timeout_is_not_unlimited(db):
    conn = psycopg.connect(db.conninfo, autocommit=True)
    try:
        with pgdb.transaction(conn, statement_timeout=0.0004):
            effective = conn.execute("SELECT current_setting('statement_timeout')").fetchone()[0]
    finally:
        conn.close()
    assert effective != "0"


@pytest.mark.parametrize("dsn", ["host=127.0.0.1 port=abc dbname=x", "host=127.0.0.1 sslmode=bogus dbname=x"])
def test_invalid_values_in_the_dsn_are_usage_errors(dsn):
    result = run_cli("audit", "--dsn", dsn, "--connect-timeout", "2")
    assert result.code == ExitCode.USAGE, result.output


def test_json_mode_stderr_is_one_json_document_when_locks_time_out(baseline_db):
    blocker = psycopg.connect(baseline_db.conninfo, application_name="brk-blocker")
    try:
        blocker.execute("SELECT 1 FROM pgflow.steps LIMIT 1")  # ACCESS SHARE held by an open transaction
        result = run_cli("migrate", "apply", "--dsn", baseline_db.conninfo, "--lock-timeout", "0.2",
                         "--retries", "2", "--format", "json")
    finally:
        blocker.rollback()
        blocker.close()
    assert result.code == ExitCode.LOCK_TIMEOUT, result.output
    error = json.loads(result.stderr)
    assert error["exit_code"] == ExitCode.LOCK_TIMEOUT


def _wait_for_lock_wait(conn, application_name: str, deadline: float) -> None:
    while not conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND application_name = %s AND wait_event_type = 'Lock'", (application_name,)).fetchone()[0]:
        assert time.monotonic() < deadline, "the command never started waiting for the lock"
        time.sleep(0.05)


def _interrupt_while_blocked(database, observer, lock_sql: str, *args: str, holder_name: str,
                             wait: float) -> tuple[int, str, str]:
    """Hold a lock (``lock_sql`` in an open transaction), run ``pgflow ARGS``, send SIGINT once it
    waits for a lock (seen by ``observer``), then let the lock go: ``(exit code, stdout, stderr)``."""
    holder = psycopg.connect(database.conninfo, application_name=holder_name)
    holder.execute(lock_sql)
    try:
        proc = popen_cli(*args)
        _wait_for_lock_wait(observer, "pgflow-cli", time.monotonic() + wait)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=wait)
    finally:
        holder.rollback()
        holder.close()
    return proc.returncode, out, err


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_ctrl_c_during_a_blocked_audit_is_exit_130_and_leaves_no_backend(db, fmt):
    """Guard: SIGINT while the audit waits for a lock ends with 130, no data on stdout, the query cancelled."""
    observer = db.connect()
    code, out, err = _interrupt_while_blocked(db, observer, "LOCK TABLE pgflow.flows IN ACCESS EXCLUSIVE MODE",
                                              "audit", "--dsn", db.conninfo, "--format", fmt,
                                              holder_name="", wait=20)
    assert code == ExitCode.INTERRUPTED, err
    assert out == ""
    assert "Traceback" not in err
    deadline = time.monotonic() + 10
    while observer.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND application_name = 'pgflow-cli'").fetchone()[0]:
        assert time.monotonic() < deadline, "the audit's backend outlived the interrupted command"
        time.sleep(0.05)


def test_ctrl_c_during_a_blocked_migration_rolls_back(baseline_db):
    """Guard: SIGINT while `migrate apply` waits for a lock: exit 130, 0003 not recorded, no lock kept."""
    observer = baseline_db.connect()
    code, _out, err = _interrupt_while_blocked(baseline_db, observer, "SELECT 1 FROM pgflow.steps LIMIT 1",
                                               "migrate", "apply", "--dsn", baseline_db.conninfo, "--lock-timeout", "30",
                                               holder_name="brk-holder", wait=30)
    assert code == ExitCode.INTERRUPTED, err
    assert [r[0] for r in observer.execute("SELECT version FROM pgflow.schema_migrations ORDER BY 1")] == [1, 2]
    assert observer.execute("SELECT pgflow.protocol_version()").fetchone()[0] == 1
    # this database's migrator lock only: other tests' migrators hold theirs on the shared server
    assert observer.execute("SELECT count(*) FROM pg_locks AS l JOIN pg_database AS d ON d.oid = l.database "
                            "WHERE l.locktype = 'advisory' AND l.classid = 1885824631 "
                            "AND d.datname = current_database()").fetchone()[0] == 0


def test_rich_markup_and_quotes_in_pgmq_meta_are_inert(baseline_db):
    """Guard: rich markup, ESC, bidi controls and SQL quotes in a pgmq.meta name stay inert in the table and the
    suggested fix quotes the name as a SQL literal (copy-paste safe)."""
    conn = baseline_db.connect()
    hostile = "x');DROP TABLE pgflow.flows;--[bold]\x1b[2J[/]\u202e"
    conn.execute("INSERT INTO pgmq.meta (queue_name, is_partitioned, is_unlogged) VALUES (%s, false, false)", (hostile,))
    table = run_cli("audit", "--dsn", baseline_db.conninfo)
    as_json = run_cli("audit", "--dsn", baseline_db.conninfo, "--format", "json")
    assert table.code == ExitCode.OK, table.output  # queue_unowned is info
    assert "\x1b" not in table.stdout and "\u202e" not in table.stdout
    assert "[bold]" in table.stdout and "\\e[2J" in table.stdout  # shown literally, not interpreted
    finding = next(f for f in json.loads(as_json.stdout)["findings"] if f["object_name"] == hostile)
    assert "pgmq.drop_queue('x'');DROP TABLE pgflow.flows;--" in finding["fix"]

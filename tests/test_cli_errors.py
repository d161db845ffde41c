"""``cli.common.mapped_errors``: the one place where a command's database errors get their meaning."""

from __future__ import annotations

import psycopg
import pytest

from pgflow_cli.cli import _reported
from pgflow_cli.cli.common import STATE, mapped_errors
from pgflow_cli.db import Target
from pgflow_cli.errors import ExitCode, LockTimeout, SchemaMissing


def test_a_missing_pgflow_object_in_the_block_is_exit_3(db):
    conn = db.connect()
    with pytest.raises(SchemaMissing) as raised, mapped_errors(Target(db.conninfo, "--dsn")):
        conn.execute("SELECT * FROM pgflow.no_such_table")
    assert raised.value.exit_code == ExitCode.CONNECTION
    assert "pgflow.no_such_table" in raised.value.message
    assert raised.value.__suppress_context__  # no chained psycopg traceback


def test_a_lock_wait_past_the_timeout_is_exit_4(db):
    holder, waiter = db.connect(autocommit=False), db.connect()
    holder.execute("LOCK TABLE pgflow.flows IN ACCESS EXCLUSIVE MODE")
    waiter.execute("SET lock_timeout = '50ms'")
    with pytest.raises(LockTimeout) as raised, mapped_errors():
        waiter.execute("SELECT count(*) FROM pgflow.flows")
    holder.rollback()
    assert raised.value.exit_code == ExitCode.LOCK_TIMEOUT


def test_other_exceptions_pass_unchanged():
    with pytest.raises(KeyError, match="not a database error"), mapped_errors():
        raise KeyError("not a database error")


def _raised_by(conn, statement: str) -> psycopg.Error:
    try:
        conn.execute(statement)
    except psycopg.Error as exc:
        return exc
    raise AssertionError(f"{statement} raised nothing")


def test_a_database_error_reaching_the_entry_point_gets_the_same_meaning(db, capsys):
    """What no command's own mapped_errors caught is mapped by main (pgflow_cli.cli._reported) the same way."""
    error = _raised_by(db.connect(), "SELECT * FROM pgflow.no_such_table")
    assert _reported(error) == ExitCode.CONNECTION
    stderr = capsys.readouterr().err
    assert "error: " in stderr and "pgflow.no_such_table" in stderr
    assert "internal error" not in stderr and "Traceback" not in stderr


@pytest.mark.parametrize("debug", [False, True])
def test_a_bug_reaching_the_entry_point_is_exit_70_with_its_traceback_only_with_debug(capsys, monkeypatch, debug):
    monkeypatch.setattr(STATE, "debug", debug)
    try:
        {}["missing key"]
    except KeyError as exc:
        bug = exc
    assert _reported(bug) == ExitCode.INTERNAL
    stderr = capsys.readouterr().err
    assert "error: internal error: KeyError: 'missing key'" in stderr
    assert "rerun with --debug" in stderr
    assert ("Traceback (most recent call last)" in stderr) is debug

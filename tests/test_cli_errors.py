"""``cli.common.mapped_errors``: the one place where a command's database errors get their meaning."""

from __future__ import annotations

import pytest

from pgflow_cli.cli.common import mapped_errors
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

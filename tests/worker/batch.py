"""Helpers of the batch-report tests: the batch entry points on any schema, and how often the
database ran a function (``pg_stat_user_functions``; the database is told to count every call).

``ensure_batch_functions`` installs tests/worker/batch_shim.sql (test scaffolding) only where
the schema lacks ``pgflow.complete_tasks`` / ``pgflow.fail_tasks`` (before migration 0010).
"""

from __future__ import annotations

from pathlib import Path

from psycopg import sql

from tests.worker.helpers import wait_until

SHIM = Path(__file__).with_name("batch_shim.sql")


def has_batch_functions(env) -> bool:
    return bool(env.val("SELECT to_regprocedure('pgflow.complete_tasks(jsonb)') IS NOT NULL "
                        "AND to_regprocedure('pgflow.fail_tasks(jsonb)') IS NOT NULL"))


def ensure_batch_functions(env) -> bool:
    """Make sure the batch entry points exist; returns True when the test stand-ins were installed."""
    if has_batch_functions(env):
        return False
    env.conn.execute(SHIM.read_text())
    return True


def drop_batch_functions(env) -> None:
    """The schema before migration 0010: no batch entry points."""
    env.conn.execute("DROP FUNCTION IF EXISTS pgflow.complete_tasks(jsonb)")
    env.conn.execute("DROP FUNCTION IF EXISTS pgflow.fail_tasks(jsonb)")


def count_function_calls(env) -> None:
    """Every session opened from now on counts the calls of every function (``track_functions``)."""
    env.conn.execute(sql.SQL("ALTER DATABASE {} SET track_functions = 'all'").format(sql.Identifier(env.db.name)))


def function_calls(env, name: str) -> int:
    """Calls of ``pgflow.<name>`` the server has counted so far (sessions report theirs when they end)."""
    env.conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(env.val("SELECT COALESCE(sum(calls), 0) AS n FROM pg_stat_user_functions "
                       "WHERE schemaname = 'pgflow' AND funcname = %s", (name,)))


def wait_for_calls(env, name: str, expected: int) -> int:
    """Wait until the counted calls of ``pgflow.<name>`` reach ``expected`` (the workers' sessions
    must have ended); returns the count, which may be higher."""
    wait_until(lambda: function_calls(env, name) >= expected, f"{expected} counted call(s) of pgflow.{name}")
    return function_calls(env, name)

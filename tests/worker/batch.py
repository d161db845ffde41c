"""Helpers of the batch-report tests: the batch entry points, and how often the database ran a
function (``pg_stat_user_functions``; the database is told to count every call).
"""

from __future__ import annotations

from psycopg import sql

from tests.worker.helpers import wait_until


def has_batch_functions(env) -> bool:
    return bool(env.val("SELECT to_regprocedure('pgflow.complete_tasks(jsonb)') IS NOT NULL "
                        "AND to_regprocedure('pgflow.fail_tasks(jsonb)') IS NOT NULL"))


def ensure_batch_functions(env) -> None:
    """The test needs the batch entry points (``complete_tasks`` / ``fail_tasks``)."""
    assert has_batch_functions(env), "the schema has no pgflow.complete_tasks / pgflow.fail_tasks"


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

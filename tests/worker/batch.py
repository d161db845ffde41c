"""Helpers of the batch-report tests: the batch entry points on any schema, and how often the
database ran a function (``pg_stat_user_functions``; the database is told to count every call).

``ensure_batch_functions`` checks that the schema has ``pgflow.complete_tasks`` /
``pgflow.fail_tasks`` (migration 0010). Before 0010 was merged these tests installed test-only
stand-ins; with 0010 in the tree they test the real functions, and the stand-ins are gone.
"""

from __future__ import annotations

from psycopg import sql

from tests.worker.helpers import wait_until


def has_batch_functions(env) -> bool:
    return bool(env.val("SELECT to_regprocedure('pgflow.complete_tasks(jsonb)') IS NOT NULL "
                        "AND to_regprocedure('pgflow.fail_tasks(jsonb)') IS NOT NULL"))


def ensure_batch_functions(env) -> None:
    """The test needs the batch entry points of migration 0010."""
    assert has_batch_functions(env), "the schema has no pgflow.complete_tasks / pgflow.fail_tasks (migration 0010)"


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

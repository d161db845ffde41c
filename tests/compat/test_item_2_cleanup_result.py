"""Item 2: cleanup_ensure_workers_logs() returns TABLE (cron_deleted bigint), as released.

docs/compatibility.md item 2. From 0006 the result is always exactly one row; the baseline
returns a plain integer, so ``SELECT cron_deleted FROM ...`` fails there.
"""

from __future__ import annotations

import uuid

from pgflow_cli import installer
from tests.compat.conftest import FAKE_CRON_HISTORY
from tests.runtime.driver import raises_sqlstate

QUERY = "SELECT cron_deleted FROM pgflow.cleanup_ensure_workers_logs(%s)"


def _history(rt) -> None:
    rt.conn.execute(FAKE_CRON_HISTORY)
    rt.conn.execute(
        "INSERT INTO cron.job_run_details (end_time) "
        "VALUES (now() - interval '30 hours'), (now() - interval '25 hours'), (now() - interval '1 hour')"
    )


def test_item_2_cleanup_ensure_workers_logs_returns_cron_deleted(old, new, baseline_db):
    with raises_sqlstate("42703", "cron_deleted"):
        old.conn.execute(QUERY, (24,))
    _upgrade_keeps_grants(old, baseline_db)

    # without pg_cron: one row, nothing deleted
    assert new.rows(QUERY, (24,)) == [{"cron_deleted": 0}]
    result = new.one(
        "SELECT pg_get_function_result('pgflow.cleanup_ensure_workers_logs(integer)'::regprocedure) AS r"
    )
    assert result["r"] == "TABLE(cron_deleted bigint)"

    _history(new)
    assert new.rows(QUERY, (24,)) == [{"cron_deleted": 2}]
    assert new.val("SELECT count(*) FROM cron.job_run_details") == 1
    assert new.rows("SELECT * FROM pgflow.cleanup_ensure_workers_logs()") == [{"cron_deleted": 0}]


SIGNATURE = "pgflow.cleanup_ensure_workers_logs(integer)"


def _upgrade_keeps_grants(old, baseline_db) -> None:
    """The result type cannot change in place: the upgrade recreates the function, and a role
    that could run the old one can run the new one; PUBLIC still cannot."""
    role = f"compat_cleanup_{uuid.uuid4().hex[:8]}"
    old.conn.execute(f'CREATE ROLE "{role}" NOLOGIN')
    try:
        old.conn.execute(f'GRANT EXECUTE ON FUNCTION {SIGNATURE} TO "{role}"')
        installer.apply(baseline_db.connect())
        assert old.val("SELECT pg_get_function_result(%s::regprocedure)", (SIGNATURE,)) == "TABLE(cron_deleted bigint)"
        assert old.val("SELECT has_function_privilege(%s, %s, 'EXECUTE')", (role, SIGNATURE)) is True
        assert old.val(
            "SELECT count(*) FROM pg_proc p, aclexplode(p.proacl) a WHERE p.oid = %s::regprocedure AND a.grantee = 0",
            (SIGNATURE,)) == 0
        assert old.val("SELECT to_regprocedure('pgflow._cleanup_ensure_workers_logs_integer(integer)')") is None
        assert old.rows(QUERY, (24,)) == [{"cron_deleted": 0}]
    finally:
        old.conn.execute(f'DROP OWNED BY "{role}"')
        old.conn.execute(f'DROP ROLE "{role}"')

"""Item 2: cleanup_ensure_workers_logs() returns TABLE (cron_deleted bigint), as released.

docs/compatibility.md item 2. From 0006 the result is always exactly one row; the baseline
returns a plain integer, so ``SELECT cron_deleted FROM ...`` fails there.
"""

from __future__ import annotations

from tests.compat.conftest import FAKE_CRON_HISTORY, NEEDS_0006
from tests.runtime.driver import raises_sqlstate

QUERY = "SELECT cron_deleted FROM pgflow.cleanup_ensure_workers_logs(%s)"


def _history(rt) -> None:
    rt.conn.execute(FAKE_CRON_HISTORY)
    rt.conn.execute(
        "INSERT INTO cron.job_run_details (end_time) "
        "VALUES (now() - interval '30 hours'), (now() - interval '25 hours'), (now() - interval '1 hour')"
    )


@NEEDS_0006
def test_item_2_cleanup_ensure_workers_logs_returns_cron_deleted(old, new):
    with raises_sqlstate("42703", "cron_deleted"):
        old.conn.execute(QUERY, (24,))

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

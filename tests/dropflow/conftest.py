"""Fixtures of the whole-flow deletion tests (pgflow.drop_flow, `pgflow drop-flow`).

* ``rt``: a :class:`tests.runtime.driver.Runtime` speaking the latest protocol on ``db`` (PGMQ and
  every migration, 0008 drop_flow included); the runtime invariants are checked after each test;
* :func:`build_every_state`: one plain flow with runs in every state a deletion must handle.
"""

from __future__ import annotations

import pytest

from tests.runtime.driver import Runtime
from tests.support.invariants import assert_runtime_invariants


PHASE1_FILES = ["_require_flow", "_lock_flow_for_deletion", "_delete_flow_rows", "_drop_flow_route", "_drop_flow_activity", "drop_flow_plan", "drop_flow"]


@pytest.fixture
def rt(db):
    conn = db.connect()
    if conn.execute("SELECT to_regproc('pgflow.drop_flow')").fetchone()[0] is None:  # TEMP until 0008
        from pgflow_cli import sqlfiles
        for name in PHASE1_FILES:
            conn.execute(sqlfiles.load(f"functions/definitions/{name}.sql"))
    runtime = Runtime(conn, level="upgraded")
    yield runtime
    assert_runtime_invariants(db.connect(), require_live_messages=runtime.require_live_messages)

"""Fixtures of the whole-flow deletion tests (pgflow.drop_flow, `pgflow drop-flow`).

* ``rt``: a :class:`tests.runtime.driver.Runtime` speaking the latest protocol on ``db`` (PGMQ and
  every migration, 0008 drop_flow included); the runtime invariants are checked after each test;
* :func:`build_every_state`: one plain flow with runs in every state a deletion must handle.
"""

from __future__ import annotations

import pytest

from tests.runtime.driver import checked_runtime


@pytest.fixture
def rt(db):
    yield from checked_runtime(db, "upgraded")

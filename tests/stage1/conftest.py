"""Fixtures of the Stage 1 (migration 0003, queue identity) SQL tests.

* ``rt``: a :class:`tests.runtime.driver.Runtime` speaking protocol 2 on ``db`` (PGMQ and
  every migration); the runtime invariants are checked after each test, as in tests/runtime;
* ``old_rt``: the same driver on ``baseline_db`` (0001-0002, protocol 1) for tests that build
  data with the released runtime and then upgrade it with :func:`upgrade`.
"""

from __future__ import annotations

import psycopg
import pytest

from pgflow_cli import installer
from tests.runtime.driver import Runtime, checked_runtime
from tests.support.levels import versions_after


@pytest.fixture
def rt(db):
    yield from checked_runtime(db, "upgraded")


@pytest.fixture
def old_rt(baseline_db):
    yield from checked_runtime(baseline_db, "baseline")


def upgrade(database, runtime: Runtime) -> list[installer.Applied]:
    """Apply the pending migrations (0003 and any later ones) with the one installer, then let ``runtime`` speak protocol 2."""
    applied = installer.apply(database.connect())
    assert [a.migration.version for a in applied] == [3, *versions_after(3)], applied
    assert runtime.val("SELECT pgflow.protocol_version()") == 2
    runtime.level = "upgraded"
    return applied


def primary(error: psycopg.Error) -> str:
    """The primary message of a database error (no DETAIL/HINT lines)."""
    return error.diag.message_primary or ""

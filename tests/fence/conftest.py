"""Fixtures of the fence tests: a FenceEnv on a fresh database with every migration; after each
test every worker process and CLI command is ended and the runtime invariants are checked."""

from __future__ import annotations

import pytest

from pgflow_cli import sqlfiles
from tests.fence.helpers import FenceEnv
from tests.support.invariants import assert_runtime_invariants


@pytest.fixture
def fenv(db, tmp_path):
    """A :class:`FenceEnv` on a fresh database (PGMQ + every migration)."""
    # PHASE 1 ONLY: the fence schema until migration 0007 exists.
    db.connect().execute(sqlfiles.load("staging/0007_fence_schema.sql"))
    environment = FenceEnv(db, tmp_path / "gate")
    try:
        yield environment
    finally:
        environment.close()
    assert_runtime_invariants(db.connect())

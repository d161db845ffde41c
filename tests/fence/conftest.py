"""Fixtures of the fence tests: a FenceEnv on a fresh database with every migration; after each
test every worker process and CLI command is ended and the runtime invariants are checked."""

from __future__ import annotations

import pytest

from tests.fence.helpers import FenceEnv
from tests.support.invariants import assert_runtime_invariants


@pytest.fixture
def fenv(db, tmp_path):
    """A :class:`FenceEnv` on a fresh database (PGMQ + every migration)."""
    environment = FenceEnv(db, tmp_path / "gate")
    try:
        yield environment
    finally:
        environment.close()
    assert_runtime_invariants(db.connect())

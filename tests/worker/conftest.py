"""Fixtures of the reference-worker tests: a WorkerEnv on a fresh database; after every test all
workers and worker processes are stopped and the runtime invariants are checked."""

from __future__ import annotations

import pytest

from tests.support.invariants import assert_runtime_invariants
from tests.worker.helpers import WorkerEnv


@pytest.fixture
def env(db):
    """A :class:`WorkerEnv` on a fresh database (PGMQ + every migration, default protocol)."""
    environment = WorkerEnv(db)
    try:
        yield environment
    finally:
        environment.close()
    assert_runtime_invariants(db.connect(), require_live_messages=environment.require_live_messages)

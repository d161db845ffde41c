"""Fixtures of the runtime tests: a Runtime driver on a fresh database, invariants after every test."""

from __future__ import annotations

import pytest

from tests.runtime.driver import Runtime
from tests.support.invariants import assert_runtime_invariants


@pytest.fixture
def rt(db):
    """A :class:`Runtime` on a fresh database (PGMQ + every migration).

    After the test body, the runtime invariants are checked on the same database
    (tests/support/invariants.py); a test that breaks a rule on purpose must repair it or set
    ``rt.require_live_messages = False`` for the one rule it breaks.
    """
    runtime = Runtime(db.connect())
    yield runtime
    check = db.connect()
    assert_runtime_invariants(check, require_live_messages=runtime.require_live_messages)

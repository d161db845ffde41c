"""Fixtures of the runtime tests: a Runtime driver on a fresh database, invariants after every test.

These tests pin the released-baseline runtime (migrations 0001-0002, protocol 1: the state an
upgrade starts from), so ``db`` is overridden here with the pre-upgrade database.
"""

from __future__ import annotations

import pytest

from tests.runtime.driver import Runtime
from tests.support.invariants import assert_runtime_invariants


@pytest.fixture
def db(baseline_db):
    """The pre-upgrade database (PGMQ + migrations 0001-0002) for every runtime test."""
    return baseline_db


@pytest.fixture
def rt(db):
    """A :class:`Runtime` on a fresh pre-upgrade database.

    After the test body, the runtime invariants are checked on the same database
    (tests/support/invariants.py); a test that breaks a rule on purpose must repair it or set
    ``rt.require_live_messages = False`` for the one rule it breaks.
    """
    runtime = Runtime(db.connect())
    yield runtime
    check = db.connect()
    assert_runtime_invariants(check, require_live_messages=runtime.require_live_messages)

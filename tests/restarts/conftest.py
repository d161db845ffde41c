"""Fixtures of the retry / resume / cancel tests: a database with every migration (the operations
arrive with 0003), the runtime driver on it, and the runtime invariants after each test."""

from __future__ import annotations

import pytest

from tests.runtime.driver import checked_runtime


@pytest.fixture
def rt(db):
    yield from checked_runtime(db, "upgraded")

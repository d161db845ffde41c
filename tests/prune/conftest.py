"""Fixtures of the pruning tests (`pgflow prune`, pgflow.prune_runs, pgflow.prune_archive).

* ``rt``: a :class:`tests.runtime.driver.Runtime` on the latest schema; the runtime invariants are
  checked after each test.
"""

from __future__ import annotations

import pytest

from tests.runtime.driver import checked_runtime


@pytest.fixture
def rt(db):
    yield from checked_runtime(db, "upgraded")

"""Fixtures of the breaker's session-4 attacks on claim_tasks (0015), complete_tasks' set-based
pass (0014) and the installer's create-only rule.

* ``cl``: a :class:`tests.claim.helpers.ClaimEnv` on a database with every migration; afterwards
  the claim ledger, message conservation and the runtime invariants (tests/claim/conftest.py's);
* ``gappy``: the same without message conservation, for tests whose killed or failed
  transactions used up message ids (sequences are not transactional: the ids have a gap the
  conservation check would count as lost); the ledger and the invariants are still checked;
* ``rt``: a protocol-2 :class:`tests.runtime.driver.Runtime` on such a database, invariants after.

tests/runtime's twin driver marks its module ``upgraded_only``: the marker is registered here too,
so importing it outside tests/runtime passes ``--strict-markers``.
"""

from __future__ import annotations

import pytest

from tests.claim.helpers import ClaimEnv
from tests.runtime.driver import Runtime, install_all
from tests.support.invariants import assert_runtime_invariants


def pytest_configure(config):
    config.addinivalue_line("markers", "upgraded_only(reason): runtime test of the queue-identity schema (0003) only")


@pytest.fixture
def cl(db):
    env = ClaimEnv(db)
    yield env
    env.check()


@pytest.fixture
def gappy(db):
    env = ClaimEnv(db)
    yield env
    assert_runtime_invariants(env.connect())
    for t in env.rows("SELECT run_id, step_slug, task_index, attempts_count FROM pgflow.step_tasks"):
        assert t["attempts_count"] == env.ledger[(t["run_id"], t["step_slug"], t["task_index"])], t


@pytest.fixture
def rt(harness, request):
    for db in harness.fresh(harness.template("latest", install_all), request):
        runtime = Runtime(db.connect(), level="upgraded")
        yield runtime
        assert_runtime_invariants(db.connect(), require_live_messages=runtime.require_live_messages)

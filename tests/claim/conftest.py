"""Fixtures of the claim-protocol tests (issue 5, docs/claim-protocol.md).

``cl`` is a :class:`tests.claim.helpers.ClaimEnv` on a fresh database with every migration
(protocol 2). After each test its checks run on a separate connection: runtime invariants,
the claim ledger (attempts == claims returned) and message conservation in every queue.
"""

from __future__ import annotations

import pytest

from tests.claim.helpers import ClaimEnv


@pytest.fixture
def cl(db):
    env = ClaimEnv(db)
    yield env
    env.check()

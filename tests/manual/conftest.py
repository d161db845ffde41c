"""Fixtures of the manual-task tests: a database with every migration, invariants after each test.

``rt`` is the runtime test driver (tests/runtime/driver.py) on the newest schema (protocol 2);
``author`` compiles a :class:`pgflow_cli.worker.flow.Flow` the way a protocol-2 worker does at
startup (``ensure_flow_compiled`` with its route map), so every flow here is authored by the Python
API and compiled, verified and stored by SQL.
"""

from __future__ import annotations

import pytest

from pgflow_cli.worker import protocol
from pgflow_cli.worker.flow import Flow
from tests.runtime.driver import checked_runtime


@pytest.fixture
def rt(db):
    yield from checked_runtime(db, "upgraded")


@pytest.fixture
def author(db):
    """``author(flow)`` compiles ``flow`` through the protocol-2 startup call; returns the verdict."""

    def compile_flow(flow: Flow) -> dict:
        with db.connect() as conn:
            verdict = protocol.ProtocolV2().compile(conn, flow.slug, flow.shape(), None)
        assert verdict["status"] in ("compiled", "verified"), verdict
        return verdict

    return compile_flow

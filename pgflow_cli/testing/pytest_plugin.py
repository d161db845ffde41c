"""pytest fixtures for testing flows against the real pgflow SQL (:mod:`pgflow_cli.testing`).

Enable them in your ``conftest.py``::

    pytest_plugins = ["pgflow_cli.testing.pytest_plugin"]

Fixtures:

* ``pgflow_server`` (session): a :class:`~pgflow_cli.testing.ThrowawayServer`, on
  ``$PGFLOW_TEST_ADMIN_DSN`` or a private server of its own, closed at the end of the session;
* ``pgflow_database``: a fresh :class:`~pgflow_cli.testing.FlowDatabase` per test, dropped after it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pgflow_cli.testing import FlowDatabase, ThrowawayServer


@pytest.fixture(scope="session")
def pgflow_server() -> Iterator[ThrowawayServer]:
    """The session's server for throwaway pgflow databases."""
    server = ThrowawayServer.from_environment()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def pgflow_database(pgflow_server: ThrowawayServer) -> Iterator[FlowDatabase]:
    """A database with PGMQ and the pgflow schema for one test."""
    with pgflow_server.database() as database:
        yield database

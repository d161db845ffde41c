"""Test fixtures: a real PostgreSQL server with real PGMQ, a fresh database per test.

Fixtures:

* ``harness``: the session's server (see tests/support/server.py);
* ``db``: a fresh database with PGMQ and every pgflow migration;
* ``baseline_db``: PGMQ and only the baseline migrations (the pre-upgrade state);
* ``empty_db``: a database with nothing installed;
* ``published_db``: a database built from the published ``@pgflow/core`` release
  (tests/support/published.py), holding exactly ``published.EXPECTED_FINDINGS``.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from pgflow_cli import installer
from tests.support import published
from tests.support.server import Harness, TestDatabase

BASELINE_VERSION = installer.BASELINE_VERSION


@pytest.fixture(scope="session")
def harness():
    h = Harness()
    try:
        yield h
    finally:
        h.close()


def _install(conninfo: str, target: int | None) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        installer.install(conn, target=target)


@pytest.fixture
def db(harness, request) -> Iterator[TestDatabase]:
    yield from harness.fresh(harness.template("latest", lambda c: _install(c, None)), request)


@pytest.fixture
def baseline_db(harness, request) -> Iterator[TestDatabase]:
    yield from harness.fresh(harness.template("baseline", lambda c: _install(c, BASELINE_VERSION)), request)


@pytest.fixture
def empty_db(harness, request) -> Iterator[TestDatabase]:
    yield from harness.fresh(None, request)


@pytest.fixture(scope="session")
def published_template(harness) -> str:
    """Name of the template database built once per test run from the published release."""
    try:
        return harness.template(
            f"published_{published.RELEASE.replace('.', '')}",
            lambda conninfo: published.build(conninfo, harness.admin),
        )
    except published.PublishedReleaseError as exc:
        pytest.fail(f"cannot build the published-release database: {exc}", pytrace=False)


@pytest.fixture
def published_db(harness, published_template, request):
    """A fresh database cloned from the published-release template."""
    yield from harness.fresh(published_template, request)

"""Fixtures for the audit tests.

* ``published_db``: a fresh clone of a database built from the published ``@pgflow/core``
  release (tests/support/published.py), holding exactly the flows and hazards listed in
  ``published.EXPECTED_FINDINGS``;
* ``baseline_db`` / ``empty_db`` / ``harness`` come from tests/conftest.py.
"""

from __future__ import annotations

import re

import pytest

from tests.support import published


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
    label = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:40]
    database = harness.clone(published_template, label)
    yield database
    harness.drop(database)

"""Fixtures of the validation tests: each test runs one ingestion version (or both) on fresh databases."""

from __future__ import annotations

import pytest

from tests.conftest import _install
from tests.validation.helpers import VERSIONS, App


@pytest.fixture
def db2(harness, request):
    """A second fresh database with PGMQ and every pgflow migration."""
    template = harness.template("latest", lambda c: _install(c, None))
    yield from harness.fresh(template, request, "_two")


@pytest.fixture(params=VERSIONS)
def app(request, db):
    """One ingestion version (``handrolled`` or ``stepqueues``) on the test's database."""
    application = App(request.param, db.conninfo)
    try:
        yield application
    finally:
        application.close()

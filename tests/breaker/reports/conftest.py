"""The breaker's batch-report tests reuse tests/runtime's twin driver, whose module marks its tests
``upgraded_only``: that marker is registered here too, so importing the driver's module outside
tests/runtime passes ``--strict-markers``."""

from __future__ import annotations


def pytest_configure(config):
    config.addinivalue_line("markers", "upgraded_only(reason): runtime test of the queue-identity schema (0003) only")

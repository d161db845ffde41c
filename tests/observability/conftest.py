"""Fixtures of the observability tests: the reference-worker environment (tests/worker)."""

from __future__ import annotations

from tests.worker.conftest import env  # noqa: F401 - the fixture, by name

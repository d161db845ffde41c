"""Fixtures for the audit tests come from tests/conftest.py (``published_db``, ``baseline_db``,
``empty_db``, ``harness``)."""

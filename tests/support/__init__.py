"""Shared helpers for the test suite (real PostgreSQL, real PGMQ; nothing mocked)."""

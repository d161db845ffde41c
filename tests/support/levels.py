"""The migration numbers this tree ships, for tests that must not hard-code the newest one."""

from __future__ import annotations

from pgflow_cli import installer


def shipped(start: int = 1) -> list[int]:
    """Every shipped migration number from ``start`` on, in order (e.g. ``[3, 8]`` from 3)."""
    return [m.version for m in installer.available_migrations() if m.version >= start]

"""Which migrations ship after a given one, so upgrade tests do not assume 0003 is the last."""

from __future__ import annotations

from pgflow_cli import installer


def versions_after(version: int) -> list[int]:
    """Versions of the shipped migrations newer than ``version``, ascending (e.g. ``[6]`` after 3)."""
    return sorted(m.version for m in installer.available_migrations() if m.version > version)

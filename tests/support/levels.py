"""Migration levels the upgrade tests name, derived from the shipped migrations (not hard-coded),
so a new migration does not break tests about the upgrade from the released baseline."""

from __future__ import annotations

from pgflow_cli import installer


def after_baseline() -> list[int]:
    """Versions an upgrade from the released baseline applies: 0003 (queue identity) and every later one."""
    return [m.version for m in installer.available_migrations() if m.version > installer.BASELINE_VERSION]


def pending_states(first: str = "pending") -> list[str]:
    """States of every migration after a baseline install: ``first`` for 0003, pending for the rest."""
    return ["applied"] * installer.BASELINE_VERSION + [first] + ["pending"] * (len(after_baseline()) - 1)


def all_levels() -> list[int]:
    """Versions a fresh install applies: every shipped migration."""
    return [m.version for m in installer.available_migrations()]

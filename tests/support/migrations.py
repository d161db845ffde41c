"""The migration numbers this tree ships, for tests that check what an install or upgrade applied.

Tests about 0001-0003 compare with these instead of literal lists, so a new migration (0004 and on)
does not break them: ``ALL`` is every shipped version, ``LATER`` those after the queue-identity
upgrade (0003), ``LATER_PENDING`` the plan states they show while still pending.
"""

from pgflow_cli import installer

ALL = [m.version for m in installer.available_migrations()]
LATER = [v for v in ALL if v > 3]
LATER_PENDING = ["pending"] * len(LATER)

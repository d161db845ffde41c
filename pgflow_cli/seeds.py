"""Sample data for the sandbox (``pgflow sandbox up --seed NAME``).

Seeds are SQL files under ``sql/seeds/`` run in one transaction through the public
pgflow functions (create_flow, add_step, start_flow, ...), never by inserting rows
behind the runtime's back, so the data is what a real deployment would hold.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from pgflow_cli import installer, sqlfiles
from pgflow_cli.db import transaction
from pgflow_cli.errors import UsageError

SEEDS = {
    "demo": {
        "file": "seeds/demo.sql",
        "schema": installer.BASELINE_VERSION,
        "about": "pre-upgrade baseline with legacy flow names and runs in several states",
    },
}


def check_name(name: str) -> None:
    """Raise :class:`UsageError` (exit 2) for an unknown seed name."""
    if name not in SEEDS:
        raise UsageError(f"unknown seed {name!r}", hint="available: " + ", ".join(f"{k} ({v['about']})" for k, v in SEEDS.items()))


def schema_target(name: str) -> int:
    """Schema version a seed is written for."""
    check_name(name)
    return int(SEEDS[name]["schema"])  # type: ignore[arg-type]


def load(sandbox, name: str, progress: Callable[[str], None] = lambda message: None) -> None:
    """Load seed ``name`` into the sandbox database in one transaction."""
    check_name(name)
    with psycopg.connect(sandbox.conninfo(), autocommit=True) as conn:
        with transaction(conn, statement_timeout=120):
            already = conn.execute(sqlfiles.statement("queries/seeds.sql", "already_seeded")).fetchone()
            if already and already[0]:
                progress(f"seed {name!r} already loaded; nothing to do")
                return
            conn.execute(sqlfiles.load(str(SEEDS[name]["file"])))  # type: ignore[arg-type]
    progress(f"loaded seed {name!r}")

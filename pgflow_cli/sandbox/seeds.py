"""Sample data for the sandbox (``pgflow sandbox up --seed NAME``).

A seed goes only through real pgflow paths (worker startup compilation, ``start_flow``,
real workers), never by inserting rows behind the runtime's back, so the data is what a
real deployment would hold. See :mod:`pgflow_cli.sandbox.demo` for the ``demo`` seed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict

from pgflow_cli import db, installer, sqlfiles
from pgflow_cli.errors import UsageError


class Seed(TypedDict):
    """One seed: the schema version its data is written for, and a line for ``--help``/errors."""

    schema: int
    about: str


SEEDS: dict[str, Seed] = {
    "demo": {
        "schema": installer.BASELINE_VERSION,
        "about": "pre-upgrade baseline: compliant and rejected flow names, runs in several states",
    },
}


def check_name(name: str) -> None:
    """Raise :class:`UsageError` (exit 2) for an unknown seed name."""
    if name not in SEEDS:
        raise UsageError(f"unknown seed {name!r}", hint="available: " + ", ".join(f"{k} ({v['about']})" for k, v in SEEDS.items()))


def schema_target(name: str) -> int:
    """Schema version a seed is written for."""
    check_name(name)
    return SEEDS[name]["schema"]


def load(conninfo: str, name: str, progress: Callable[[str], None] = lambda message: None) -> bool:
    """Load seed ``name`` into the sandbox database at ``conninfo``; returns False when it was already loaded."""
    check_name(name)
    with db.connect(db.Target(conninfo, "sandbox"), application_name="pgflow-cli seed") as conn:
        row = conn.execute(sqlfiles.statement("queries/seeds.sql", "already_seeded")).fetchone()
    if row and row[0]:
        progress(f"the sandbox already holds flows; seed {name!r} not loaded again (use `pgflow sandbox reset --seed {name}`)")
        return False
    from pgflow_cli.sandbox import demo

    demo.seed(conninfo, progress)
    progress(f"loaded seed {name!r}")
    return True

"""``pgflow migrate``: show, plan and apply the shipped migrations safely, one concern a module:

* :mod:`~pgflow_cli.operations.migrate.verdict`: ``migrate status`` (what is true, its verdict and
  exit code) and what to say after Ctrl-C;
* :mod:`~pgflow_cli.operations.migrate.plan`: ``migrate plan`` and the preflight audit;
* :mod:`~pgflow_cli.operations.migrate.apply`: ``migrate apply`` (one run of the installer's
  engine, the lock watcher, the result) and ``migrate abort``;
* :mod:`~pgflow_cli.operations.migrate.script`: ``migrate apply --sql`` (the same run, rendered).

Progress is the installer's typed events, re-exported here as :mod:`events` for the command line.
"""

from __future__ import annotations

from pgflow_cli.installer import events
from pgflow_cli.operations.migrate.apply import (
    LockWatcher,
    MigrateResult,
    Phase,
    abort,
    apply,
    describe_blocker,
    live_workers,
)
from pgflow_cli.operations.migrate.plan import PlanReport, Preflight, make_plan, preflight
from pgflow_cli.operations.migrate.script import Script, sql_script
from pgflow_cli.operations.migrate.verdict import (
    StatusReport,
    blocking_conflict,
    interrupted,
    status,
    status_rows,
    summary,
)

__all__ = [
    "LockWatcher", "MigrateResult", "Phase", "PlanReport", "Preflight", "Script", "StatusReport", "abort", "apply",
    "blocking_conflict", "describe_blocker", "events", "interrupted", "live_workers", "make_plan", "preflight",
    "sql_script", "status", "status_rows", "summary",
]

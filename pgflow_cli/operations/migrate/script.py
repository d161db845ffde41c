"""``migrate apply --sql``: the run ``migrate apply`` would make, rendered by the installer's engine
as a psql script (or as text for review only, where a step needs the tool)."""

from __future__ import annotations

import psycopg

from pgflow_cli import installer
from pgflow_cli.installer import Script
from pgflow_cli.operations import upstream
from pgflow_cli.operations.migrate.verdict import blocking_conflict

__all__ = ["Script", "sql_script"]


def sql_script(conn: psycopg.Connection, *, target_version: int | None = None, assume_release: str | None = None,
               online: str = "auto", lock_timeout: float = 5.0) -> Script:
    """What ``migrate apply`` runs here on its one-transaction paths, as one psql script: the same
    steps through the same engine (:func:`pgflow_cli.installer.render`), their statements written
    instead of sent.

    Each migration is one ``BEGIN ... COMMIT`` holding the migrators' advisory lock, the local
    ``lock_timeout``, its table locks (taken first, in the lock order), every phase apply runs on
    that path (marked ``-- phase NAME`` comments; ``notx`` phases are left out as apply leaves them
    out, a ``batch`` backfill runs once over the whole table), and its ledger rows, with every value
    written in: no placeholder, no abort phase. ``psql -v ON_ERROR_STOP=1 -f script.sql`` runs it.

    The adoption of a database a pgflow release installed, and the conversion of an earlier build's
    ledger, are printed for review only (commented out): each needs a check of the catalog only the
    tool makes; the migrations after them are printed once they are applied.

    Raises:
        StateConflict: what stops ``apply`` (exit 6), or a migration in progress: its remaining
            phases run only phase by phase, which cannot be printed as one script.
        UsageError: ``online="always"``: the phased path cannot be printed as one script (exit 2).
    """
    plan = installer.make_plan(conn)
    found = upstream.inspect(conn, assume_release=assume_release)
    conflict = blocking_conflict(plan, found)
    if conflict:
        raise conflict
    steps = upstream.steps_before_migrations(found, assume_release=assume_release, dry_run=True)
    steps.append(installer.Migrations(target_version))
    return installer.render(conn, steps, installer.Options(online=online, lock_timeout=lock_timeout))

"""What a command's missing pgflow object means: no pgflow schema, a schema at an earlier level, or
an object missing from an up-to-date schema (docs/exit-codes.md, exit 3).

Every command reads objects that some migration added. On a database at an earlier level (the
baseline before an upgrade, an upgrade window, a database pgflow itself installed) a query then
fails with "relation/column/function does not exist". This module turns that into the error an
operator can act on: the level is read from the migration ledger (:func:`pgflow_cli.installer.make_plan`),
never guessed from the message, and the hint names the command that adds what is missing.
"""

from __future__ import annotations

import psycopg
from psycopg import errors as pgerrors

from pgflow_cli import installer, sqlfiles
from pgflow_cli.db import first_line
from pgflow_cli.errors import SchemaMissing
from pgflow_cli.installer.catalog import Difference

UNDEFINED_OBJECT_ERRORS = (pgerrors.UndefinedTable, pgerrors.UndefinedColumn, pgerrors.UndefinedFunction,
                           pgerrors.InvalidSchemaName, pgerrors.UndefinedObject)
"""42P01, 42703, 42883, 3F000, 42704: what a statement meets on a schema without the objects it names."""

UPGRADE_HINT = "upgrade it: `pgflow migrate plan` shows what `pgflow migrate apply` would do, then run that (docs/upgrade.md)"
INSTALL_HINT = ("install pgflow here with `pgflow migrate apply` (add --install-pgmq where PGMQ is missing; "
                "`pgflow migrate plan` shows it first), or connect to the database that holds pgflow "
                "(--dsn, PGFLOW_DATABASE_URL, DATABASE_URL, PG* variables)")


def missing_feature(conn: psycopg.Connection, feature: str | None = None, cause: str | None = None) -> SchemaMissing:
    """The exit-3 error of a command that needs what the database's pgflow schema does not have.

    Args:
        conn: an open autocommit connection to the database (no transaction in progress).
        feature: what the command needs, in words (``"the rollout-fence record (pgflow.fences)"``), or
            None when only the server's error (``cause``) names it.
        cause: the first line of the server's error, shown as detail, or None.

    Returns:
        :class:`SchemaMissing` with reason ``schema_missing`` (no pgflow schema), ``schema_behind``
        (migrations pending, or a schema pgflow itself installed and pgflow-cli has not adopted yet)
        or ``object_missing`` (up to date, yet the object is not there: dropped by hand, or a bug).
    """
    detail = [cause] if cause else []
    needs = f": this command needs {feature}" if feature else ""
    plan = installer.make_plan(conn)
    database = plan.state.database_name
    if not plan.state.has_pgflow_schema or not (plan.state.has_flows_table or plan.state.has_ledger):
        return SchemaMissing(f"database {database!r} has no pgflow schema{needs}", hint=INSTALL_HINT, detail=detail,
                             reason="schema_missing")
    if plan.state.foreign_pgflow:
        return SchemaMissing(
            f"the pgflow schema of database {database!r} was installed by pgflow itself and is older than this "
            f"command needs{needs}", hint=UPGRADE_HINT + "; `pgflow migrate apply` adopts it first", detail=detail,
            reason="schema_behind")
    if plan.pending:
        applied = [s.version for s in plan.statuses if s.state == "applied"]
        level = f"migration {max(applied):04d}" if applied else "no migration"
        return SchemaMissing(
            f"the pgflow schema of database {database!r} is older than this command needs (it stands at {level}, "
            f"{len(plan.pending)} migration(s) pending){needs}", hint=UPGRADE_HINT, detail=detail,
            reason="schema_behind")
    return SchemaMissing(
        f"{feature or 'a pgflow object'} is missing from database {database!r}, although its pgflow schema is up to date",
        hint="an object was dropped or changed by hand: `pgflow migrate status` shows function-file drift; "
        "restore it from the pgflow-cli release that installed it",
        detail=detail, reason="object_missing")


def explain(conn: psycopg.Connection, exc: psycopg.Error) -> SchemaMissing | None:
    """The error that a statement's undefined-object failure stands for, or None for other errors
    and for a missing column or function in an up-to-date schema (a bug: the caller keeps its mapping).

    Args:
        conn: the command's connection; it must be usable (autocommit, the failed transaction
            rolled back). When it is not, None.
        exc: what the statement raised.
    """
    from psycopg import pq

    if not isinstance(exc, UNDEFINED_OBJECT_ERRORS) or conn.closed \
            or conn.info.transaction_status != pq.TransactionStatus.IDLE:
        return None
    try:
        error = missing_feature(conn, None, first_line(exc))
    except psycopg.Error:
        return None
    if error.reason == "object_missing" and not isinstance(exc, (pgerrors.UndefinedTable, pgerrors.InvalidSchemaName)):
        return None
    return error


def require_objects(conn: psycopg.Connection, queries: str, feature: str) -> None:
    """Raise :func:`missing_feature` (exit 3) unless the ``installed`` statement of ``queries`` says yes.

    Args:
        conn: an autocommit connection, no transaction in progress.
        queries: a query file (``queries/drop_flow.sql``) whose ``installed`` statement returns one boolean.
        feature: what the command needs, in words, for the message.
    """
    try:
        row = conn.execute(sqlfiles.statement(queries, "installed")).fetchone()
    except psycopg.errors.InvalidSchemaName:
        row = None
    if not row or not row[0]:
        raise missing_feature(conn, feature)


def database_breaks(conn: psycopg.Connection) -> list[Difference]:
    """The runtime breaks of ``conn``'s pgflow schema (read-only, catalog reads only), for
    ``migrate status`` and ``audit``.

    Against what its level should be: a pgflow-cli ledger with every shipped migration applied, the
    head shape; with exactly the baseline applied (an adoption, the rest pending), the baseline
    shape; a schema a pgflow release installed, that release's tables and columns (recognition). An
    index an online adoption has still to build is not a break. At any other level (a phased
    migration part way, an earlier build's ledger to convert) nothing is compared: the migration
    that moves on checks its own start.
    """
    from pgflow_cli.installer.catalog import read_schema_facts
    from pgflow_cli.installer.ledger import make_plan
    from pgflow_cli.installer.shapes import runtime_breaks, shape
    from pgflow_cli.upstream import recognise as rec
    from pgflow_cli.upstream import releases

    found = read_schema_facts(conn)
    if not found["table"]:
        return []
    plan = make_plan(conn)
    if plan.state.has_ledger:
        if plan.state.foreign_ledger or plan.in_progress or plan.conversion is not None or plan.unknown or plan.changed:
            return []
        from pgflow_cli.upstream.adopt import pending_completion

        states = {s.version: s.state for s in plan.statuses}
        applied = {v for v, state in states.items() if state == "applied"}
        level = "head" if applied == set(states) else "baseline" if applied == {1, 2} else None
        if level is None:
            return []
        # an online adoption builds its index after its commit: missing until then, not broken
        building = any(step.get("step") == "index" for step in pending_completion(conn))
        return [d for d in runtime_breaks(shape(level), found)
                if not (building and d.kind == "index" and d.change == "missing")]
    recognition = rec.recognise(conn)
    if recognition.status not in (rec.UPSTREAM, rec.UNRECOGNISED) or recognition.release is None:
        return []
    release = releases.shape(releases.group_of(recognition.release))
    kinds = ("table", "column")
    return runtime_breaks({k: release[k] for k in kinds}, {k: found[k] for k in kinds})

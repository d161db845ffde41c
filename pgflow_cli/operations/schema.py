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

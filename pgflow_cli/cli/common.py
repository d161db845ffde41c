"""Options shared by every command, and the per-invocation context.

Every command that touches a database accepts ``--dsn``, ``--sandbox`` and
``--connect-timeout``; every command that reports accepts ``--format``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Optional

import psycopg
import typer

from pgflow_cli import db
from pgflow_cli.errors import UsageError


class OutputFormat(str, enum.Enum):
    """Report formats: ``table`` for people, ``json`` (versioned) and ``csv`` for automation."""

    table = "table"
    json = "json"
    csv = "csv"


DsnOption = Annotated[
    Optional[str],
    typer.Option(
        "--dsn",
        help="Connection string (key=value or postgresql:// URL). Default: $PGFLOW_DATABASE_URL, "
        "$DATABASE_URL, then libpq's PG* variables, service file and .pgpass. Never printed with its password.",
        show_default=False,
        metavar="DSN",
    ),
]
SandboxOption = Annotated[
    bool,
    typer.Option("--sandbox", help="Target the local sandbox database (see `pgflow sandbox up`)."),
]
ConnectTimeoutOption = Annotated[
    int,
    typer.Option("--connect-timeout", min=1, help="Seconds to wait for the server to answer.", metavar="SECONDS"),
]
FormatOption = Annotated[
    OutputFormat,
    typer.Option("--format", "-f", help="Output format: table (people), json (versioned document), csv (rows).",
                 case_sensitive=False),
]


@dataclass
class State:
    """What the top-level callback learned (``--debug``) and what commands set (format)."""

    debug: bool = False
    output_format: OutputFormat = OutputFormat.table


STATE = State()


@contextmanager
def mapped_errors(target: db.Target | None = None) -> Iterator[None]:
    """Where every command's database errors become the :class:`PgflowError` they mean.

    A ``psycopg.Error`` raised in the block is re-raised as :func:`pgflow_cli.db.map_database_error`
    maps it (exit 3/4/6/70, docs/exit-codes.md), its message redacted of ``target``'s password;
    other exceptions pass unchanged. :func:`pgflow_cli.cli.main` wraps every command in it (and
    prints what it raises); a command that holds a connection wraps its work in it with the target.

    Args:
        target: the database the block talks to, or None when no connection string is known.

    Raises:
        PgflowError: for a psycopg error in the block.
    """
    try:
        yield
    except psycopg.Error as exc:
        raise db.map_database_error(exc, target=target) from None


def resolve(dsn: str | None, sandbox: bool) -> db.Target:
    """Pick the target: ``--sandbox`` or the usual precedence (see :mod:`pgflow_cli.db`).

    Raises:
        UsageError: ``--dsn`` and ``--sandbox`` together.
    """
    if sandbox:
        if dsn:
            raise UsageError("--dsn and --sandbox name two different databases; give only one")
        from pgflow_cli.sandbox import Sandbox

        return db.Target(Sandbox.default().running_conninfo(), "sandbox")
    return db.resolve_target(dsn)


def open_connection(dsn: str | None, sandbox: bool, connect_timeout: int) -> tuple[psycopg.Connection, db.Target]:
    """Resolve the target and connect (autocommit; transactions are explicit)."""
    target = resolve(dsn, sandbox)
    return db.connect(target, connect_timeout=connect_timeout), target

"""Options shared by every command, and the per-invocation context.

Every command that touches a database accepts ``--dsn``, ``--sandbox`` and
``--connect-timeout`` (one :class:`TargetOptions` parameter, shown to typer by
:func:`option_groups`); every command that reports accepts ``--format``. The per-invocation
:data:`STATE` and :class:`OutputFormat` live in the light :mod:`pgflow_cli.cli.state` (the root
command needs them) and are re-exported here, where every command imports them from.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import psycopg
import typer

from pgflow_cli import db
from pgflow_cli.cli.state import STATE as STATE
from pgflow_cli.cli.state import FormatOption as FormatOption
from pgflow_cli.cli.state import OutputFormat as OutputFormat
from pgflow_cli.cli.state import ReportFormat as ReportFormat
from pgflow_cli.cli.state import ReportFormatOption as ReportFormatOption
from pgflow_cli.cli.state import State as State
from pgflow_cli.cli.state import _default_format as _default_format
from pgflow_cli.errors import UsageError

DsnOption = Annotated[
    str | None,
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
@dataclass(frozen=True)
class TargetOptions:
    """``--dsn``, ``--sandbox`` and ``--connect-timeout``: the database a command talks to.

    A command declares ``where: TargetOptions = ANY_TARGET`` and is decorated with
    :func:`option_groups`, which shows typer the three options in its place.
    """

    dsn: DsnOption = None
    sandbox: SandboxOption = False
    connect_timeout: ConnectTimeoutOption = 10

    def open(self) -> tuple[psycopg.Connection, db.Target]:
        """Connect to the target: :func:`open_connection`."""
        return open_connection(self.dsn, self.sandbox, self.connect_timeout)

    def resolve(self) -> db.Target:
        """The target without connecting: :func:`resolve`."""
        return resolve(self.dsn, self.sandbox)

    @contextmanager
    def connected(self) -> Iterator[tuple[psycopg.Connection, db.Target]]:
        """Connect (:meth:`open`); in the block, database errors are mapped with the target
        (:func:`mapped_errors`); the connection is closed at the end (``with conn``)."""
        conn, target = self.open()
        with conn, mapped_errors(target, conn):
            yield conn, target


ANY_TARGET = TargetOptions()
"""The default of a command's :class:`TargetOptions` parameter (typer fills in the options given)."""

R = TypeVar("R")


def option_groups(command: Callable[..., R]) -> Callable[..., R]:
    """Let a typer command take a group of options as one dataclass parameter.

    typer reads a command's options from its signature and has no option groups. In the
    signature typer sees, every parameter of ``command`` annotated with a dataclass (e.g.
    :class:`TargetOptions`) stands replaced by the dataclass's fields, at its place, with the
    fields' names, ``Annotated[..., typer.Option(...)]`` types and defaults; ``command`` is
    called with the dataclass built from those options. Apply it below ``@app.command()``.

    Args:
        command: the command function (its parameters typer options and arguments).

    Returns:
        The function to register with typer.
    """
    hints = typing.get_type_hints(command, include_extras=True)
    parameters: list[inspect.Parameter] = []
    groups: dict[str, tuple[type[Any], tuple[str, ...]]] = {}
    for parameter in inspect.signature(command).parameters.values():
        annotation = hints.get(parameter.name, parameter.annotation)
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
            fields = typing.get_type_hints(annotation, include_extras=True)
            members = dataclasses.fields(annotation)
            parameters += [inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, annotation=fields[field.name],
                                             default=inspect.Parameter.empty if field.default is dataclasses.MISSING
                                             else field.default) for field in members]
            groups[parameter.name] = (annotation, tuple(field.name for field in members))
        else:
            parameters.append(parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=annotation))

    @functools.wraps(command)
    def grouped(**options: Any) -> R:
        for name, (group, names) in groups.items():
            options[name] = group(**{field: options.pop(field) for field in names})
        return command(**options)

    grouped.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    grouped.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
    return grouped



_COMMAND = re.compile(
    r"(?P<cmd>\bpgflow (?:audit|coverage|drop-flow|status|worker"
    r"|(?:migrate|fence|task|runs|workers) (?:status|plan|apply|abort|disable|restore|list|show|complete|fail"
    r"|start|wait|forget)))"
    r"(?![\w-])(?! --(?:dsn|sandbox)\b)"
)


PASSWORD_LEFT_OUT = ("the password is left out: typed when asked on a terminal; elsewhere set PGPASSWORD, or give "
                     "the whole connection string in PGFLOW_DATABASE_URL, or use a libpq service file")
"""Said after commands that repeat a ``--dsn`` whose password was left out (they connect only once it
is supplied another way)."""


def with_target(text: str, target: db.Target | None = None, *, note: bool = True) -> str:
    """``text`` with every ``pgflow <command>`` that needs a database followed by the target option
    the user gave (:meth:`pgflow_cli.db.Target.option`: ``--dsn '...'`` without password, or
    ``--sandbox``), so a hint works when pasted. Unchanged when the target came from the environment.

    Args:
        text: a hint, a ``next:`` line or an error message.
        target: the command's target (default: the one :func:`open_connection` resolved).
        note: when the ``--dsn`` held a password (left out of the commands), end the text with
            :data:`PASSWORD_LEFT_OUT` in parentheses, which says how to supply it. False for a bare
            command (a JSON ``next`` list).
    """
    target = target or STATE.target or db.Target("", "")
    option = target.option()
    if not option:
        return text
    result, count = _COMMAND.subn(lambda m: f"{m.group('cmd')} {option}", text)
    if count and note and target.source == "--dsn" and db.has_password(target.conninfo) \
            and PASSWORD_LEFT_OUT not in result:
        result += f" ({PASSWORD_LEFT_OUT})"
    return result


@contextmanager
def mapped_errors(target: db.Target | None = None, conn: psycopg.Connection | None = None) -> Iterator[None]:
    """Where every command's database errors become the :class:`PgflowError` they mean.

    A ``psycopg.Error`` raised in the block is re-raised as :func:`pgflow_cli.db.map_database_error`
    maps it (exit 3/4/6/70, docs/exit-codes.md), its message redacted of ``target``'s password;
    other exceptions pass unchanged. :func:`pgflow_cli.cli.main` wraps every command in it (and
    prints what it raises); a command that holds a connection wraps its work in it with the target.
    With ``conn``, a missing table, column or function is first explained by the database's schema
    level (:func:`pgflow_cli.operations.schema.explain`): no pgflow schema, or migrations pending,
    is exit 3 naming `pgflow migrate apply`, never an internal error.

    Args:
        target: the database the block talks to, or None when no connection string is known.
        conn: the block's connection (autocommit), to read the schema level from after a failure.

    Raises:
        PgflowError: for a psycopg error in the block.
    """
    try:
        yield
    except psycopg.Error as exc:
        if conn is not None:
            from pgflow_cli.operations import schema

            explained = schema.explain(conn, exc)
            if explained is not None:
                raise explained from None
        raise db.map_database_error(exc, target=target) from None


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(?P<n>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[smhd]?)\s*$")


def parse_duration(text: str, option: str) -> float:
    """Seconds in ``text``: a number with an optional unit s, m, h or d (``90``, ``15m``, ``2h``, ``1d``).

    Args:
        text: what was given.
        option: the option it was given to (``--older-than``), for the message.

    Raises:
        UsageError: anything else (exit 2).
    """
    match = _DURATION.match(text or "")
    if not match:
        raise UsageError(f"{option} {text!r} is not a duration", hint="use e.g. 90, 90s, 15m, 2h or 1d")
    return float(match.group("n")) * _UNITS[match.group("unit") or "s"]


def versioned(document: dict[str, Any], target: db.Target | None = None) -> dict[str, Any]:
    """A command's JSON document in the common shape (docs/commands/README.md "JSON documents"):
    ``kind``, ``version``, ``tool_version`` and ``database`` first, then the rest.

    ``database`` is :meth:`pgflow_cli.db.Target.to_dict` of the connected target; when the document
    already has a ``database`` object (the audit's), the connection's facts are added to it.
    """
    from pgflow_cli import __version__

    head: dict[str, Any] = {"kind": document["kind"], "version": document["version"],
                            "tool_version": document.get("tool_version", __version__)}
    if target is not None:
        own = document.get("database")
        head["database"] = {**target.to_dict(), **own} if isinstance(own, dict) else target.to_dict()
    return {**head, **{key: value for key, value in document.items() if key not in head}}


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
    """Resolve the target and connect (autocommit; transactions are explicit).

    Returns:
        The connection and the target with the facts of the server it reached
        (:meth:`pgflow_cli.db.Target.connected`: banners and JSON ``database`` objects use them).
    """
    target = resolve(dsn, sandbox)
    STATE.target = target
    conn = db.connect(target, connect_timeout=connect_timeout)
    target = target.connected(conn)
    STATE.target = target
    return conn, target

"""Options shared by every command, and the per-invocation context.

Every command that touches a database accepts ``--dsn``, ``--sandbox`` and
``--connect-timeout`` (one :class:`TargetOptions` parameter, shown to typer by
:func:`option_groups`); every command that reports accepts ``--format``. The per-invocation
:data:`STATE` and :class:`OutputFormat` live in the light :mod:`pgflow_cli.cli.state` (the root
command needs them) and are re-exported here, where every command imports them from.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import re
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import psycopg
import typer

from pgflow_cli import db, render
from pgflow_cli.cli.state import STATE as STATE
from pgflow_cli.cli.state import OutputFormat as OutputFormat
from pgflow_cli.cli.state import State as State
from pgflow_cli.errors import UsageError


def _default_format(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """``--format`` not given and stdout not a terminal: ``plain`` instead of ``table`` (for formats
    that have it); the chosen format is also what errors are reported in."""
    source = ctx.get_parameter_source(param.name or "")
    if (source is None or source.name in ("DEFAULT", "DEFAULT_MAP")) and value is not None \
            and str(getattr(value, "value", value)) == "table" and not render.stdout_is_terminal():
        with suppress(ValueError):
            value = type(value)("plain")
    if isinstance(value, enum.Enum) and value.value in OutputFormat._value2member_map_:
        STATE.output_format = OutputFormat(value.value)
    return value


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
FormatOption = Annotated[
    OutputFormat,
    typer.Option("--format", "-f", help="Output format: table (terminal default), plain (default when piped; "
                 "tabulate text for grep), markdown (for tickets), json (versioned document, docs/schemas/), "
                 "csv (rows).", case_sensitive=False, callback=_default_format),
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
        with mapped_errors(target), conn:
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
    r"|(?:migrate|fence|task|runs) (?:status|plan|apply|abort|disable|restore|list|show|complete|fail|start|wait)))"
    r"(?![\w-])(?! --(?:dsn|sandbox)\b)"
)


def with_target(text: str, target: db.Target | None = None) -> str:
    """``text`` with every ``pgflow <command>`` that needs a database followed by the target option
    the user gave (:meth:`pgflow_cli.db.Target.option`: ``--dsn '...'`` without password, or
    ``--sandbox``), so a hint works when pasted. Unchanged when the target came from the environment.

    Args:
        text: a hint, a ``next:`` line or an error message.
        target: the command's target (default: the one :func:`open_connection` resolved).
    """
    option = (target or STATE.target or db.Target("", "")).option()
    if not option:
        return text
    return _COMMAND.sub(lambda m: f"{m.group('cmd')} {option}", text)


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

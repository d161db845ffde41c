"""The per-invocation state of the command line and the report formats.

Kept apart from :mod:`pgflow_cli.cli.common` (which re-exports both names) because the root
command needs them before any command is chosen, and this module imports neither psycopg nor
rich: ``pgflow --help`` and ``pgflow --version`` stay as cheap as typer itself
(:mod:`pgflow_cli.cli.lazy`).
"""

from __future__ import annotations

import enum
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from pgflow_cli import db


class OutputFormat(str, enum.Enum):
    """Report formats (docs/commands/README.md): ``table`` for a terminal, ``plain`` for pipes and grep
    (the default when stdout is not a terminal), ``markdown`` for tickets, ``json`` (versioned) and
    ``csv`` for automation."""

    table = "table"
    plain = "plain"
    markdown = "markdown"
    json = "json"
    csv = "csv"

    @property
    def human(self) -> bool:
        """A format for people (``table``, ``plain``, ``markdown``): progress lines go to stderr."""
        from pgflow_cli import render  # a command that reports has imported it already

        return self.value in render.TEXT_FORMATS


class ReportFormat(str, enum.Enum):
    """The formats of a command that reports one document, not rows (``status``, ``runs``, ``drop-flow``,
    ``fence``): :class:`OutputFormat` without ``csv``, so ``--help`` offers only what works."""

    table = "table"
    plain = "plain"
    markdown = "markdown"
    json = "json"


@dataclass
class State:
    """What the top-level callback learned (``--debug``) and what commands set (format, target).

    Attributes:
        debug: ``--debug`` was given (anywhere before ``--``): internal errors show their traceback.
        output_format: the ``--format`` of the running command; errors are reported in it.
        target: the database the command resolved (hints repeat its option), None before that.
    """

    debug: bool = False
    output_format: OutputFormat = OutputFormat.table
    target: db.Target | None = None


STATE = State()
"""The one :class:`State` of this process."""


def _stdout_is_terminal() -> bool:
    import sys

    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def _default_format(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """``--format`` not given and stdout not a terminal: ``plain`` instead of ``table`` (for formats
    that have it); the chosen format is also what errors are reported in."""
    source = ctx.get_parameter_source(param.name or "")
    if value is None:  # typer before 0.29 drops a default that is not one of the option's own choices
        value = OutputFormat.table
    if (source is None or source.name in ("DEFAULT", "DEFAULT_MAP")) and value is not None \
            and str(getattr(value, "value", value)) == "table" and not _stdout_is_terminal():
        with suppress(ValueError):
            value = type(value)("plain")
    if isinstance(value, enum.Enum) and value.value in OutputFormat._value2member_map_:
        STATE.output_format = OutputFormat(value.value)
        return STATE.output_format  # one type for the command, whichever set of choices it offered
    return value


FormatOption = Annotated[
    OutputFormat,
    typer.Option("--format", "-f", help="Output format: table (terminal default), plain (default when piped; "
                 "tabulate text for grep), markdown (for tickets), json (versioned document, docs/schemas/), "
                 "csv (rows).", case_sensitive=False, callback=_default_format),
]
"""``--format`` of a command with rows: every :class:`OutputFormat`."""
if TYPE_CHECKING:  # what the command receives: the callback converts the choice
    ReportFormatOption = FormatOption
else:  # what typer reads the choices from
    ReportFormatOption = Annotated[
        ReportFormat,
        typer.Option("--format", "-f", help="Output format: table (terminal default), plain (default when piped; "
                     "tabulate text for grep), markdown (for tickets), json (versioned document, docs/schemas/).",
                     case_sensitive=False, callback=_default_format),
    ]
"""``--format`` of a command that reports one document (no ``csv`` among the choices); the command
receives an :class:`OutputFormat` all the same (the option's callback converts it)."""


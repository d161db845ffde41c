"""The per-invocation state of the command line and the report formats.

Kept apart from :mod:`pgflow_cli.cli.common` (which re-exports both names) because the root
command needs them before any command is chosen, and this module imports neither psycopg nor
rich: ``pgflow --help`` and ``pgflow --version`` stay as cheap as typer itself
(:mod:`pgflow_cli.cli.lazy`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

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

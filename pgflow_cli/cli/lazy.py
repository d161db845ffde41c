"""Commands imported when they are used: the root ``pgflow`` group loads one command's module, not all.

Every command module imports what its work needs (psycopg, rich, its operations); importing all
of them cost every ``pgflow`` process about half a second of CPU. The root group is a
:class:`LazyGroup` (typer's ``Typer(cls=...)``, a click group whose ``get_command`` loads on first
use, the pattern click documents for lazily loaded subcommands). It knows each command by a
:class:`LazyCommand`: its name, the module whose ``register(app)`` attaches it, and the one-line
summary ``pgflow --help`` lists, so the listing imports no command module either.

Until it is loaded a command is a stand-in carrying its summary as help text: its name counts
for typer's "Did you mean" suggestions and its summary is shortened exactly as the real command's
first sentence would be (tests/output/test_lazy_commands.py compares the two).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import typer
import typer.main
from typer.core import TyperCommand, TyperGroup

if TYPE_CHECKING:  # typer >= 0.26 vendors click; its classes are only needed for the annotations
    from typer._click import Command, Context, HelpFormatter


@dataclass(frozen=True)
class LazyCommand:
    """One command (or group of commands) of the root, before it is imported.

    Attributes:
        name: the command's name (``drop-flow``, ``migrate``).
        module: the module defining it, whose ``register(app: typer.Typer)`` attaches it under ``name``.
        summary: the first sentence of its help text, as ``pgflow --help`` lists it.
        section: the heading ``pgflow --help`` lists it under (:attr:`LazyGroup.sections`); ``""`` for none.
    """

    name: str
    module: str
    summary: str
    section: str = ""

    def load(self, group: TyperGroup) -> Command:
        """Import the module and build the click command typer makes of what it registers.

        Args:
            group: the group the command belongs to; its ``rich_markup_mode`` and
                ``suggest_commands`` are the ones the command gets, as if registered on it directly.

        Returns:
            The command (a ``TyperCommand``, or a ``TyperGroup`` for a group such as ``migrate``).

        Raises:
            ImportError: the module cannot be imported.
            KeyError: the module's ``register`` attached nothing named :attr:`name` (a bug).
        """
        module = importlib.import_module(self.module)
        holder = typer.Typer(rich_markup_mode=group.rich_markup_mode, suggest_commands=group.suggest_commands)
        module.register(holder)
        command = typer.main.get_group(holder).commands[self.name]
        flags_off_by_default(command)
        return command


def flags_off_by_default(command: Command) -> None:
    """Make the boolean flags of ``command`` (its help flag too) and of its subcommands default to False
    instead of None.

    typer (0.29) converts every option value but a bool through pydantic, whose import costs about a
    tenth of a second of CPU; its --install-completion/--show-completion flags and every command's help
    flag default to None, so each command paid it, even one with no option of its own (``pgflow sandbox
    dsn``). A flag not given means the same either way. Options of other types are left as they are.
    """
    for param in command.params:
        if getattr(getattr(param, "type_descriptor", None), "annotation", None) is bool and param.default is None:
            param.default = False
    make_help_option = command.get_help_option

    def help_option(ctx: Context) -> Any:
        option = make_help_option(ctx)
        if option is not None and option.default is None:
            option.default = False
        return option

    command.get_help_option = help_option  # type: ignore[method-assign]
    for sub in getattr(command, "commands", {}).values():
        if not isinstance(sub, _StandIn):
            flags_off_by_default(sub)


class _StandIn(TyperCommand):
    """A command not imported yet: only its name and summary, for listings and suggestions."""

    def __init__(self, lazy: LazyCommand, group: TyperGroup) -> None:
        super().__init__(lazy.name, help=lazy.summary, rich_markup_mode=group.rich_markup_mode)
        self.lazy = lazy


class LazyGroup(TyperGroup):
    """A typer group whose commands are imported on first use (``typer.Typer(cls=...)``).

    A subclass names its commands in :attr:`lazy_commands`, in the order the help lists them;
    commands registered on the typer app the usual way come first and are not lazy.
    ``get_command`` (what click calls to run a command, show its help or complete it) loads the
    command once and keeps it; the group's own help lists the stand-ins' summaries. With
    ``rich_markup_mode`` other than None, typer's rich help would load every command to list it.
    """

    lazy_commands: ClassVar[Sequence[LazyCommand]] = ()
    """The lazily loaded commands, in listing order."""
    sections: ClassVar[Sequence[tuple[str, str]]] = ()
    """``(section, heading)`` in the order the help shows them; commands of no section come last,
    under "Commands"."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for lazy in self.lazy_commands:
            self.commands.setdefault(lazy.name, _StandIn(lazy, self))

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        """Parse the root's own options, its flags off by default (:func:`flags_off_by_default`)."""
        flags_off_by_default(self)
        return super().parse_args(ctx, args)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        """The command named ``cmd_name``, imported now if it was not yet (:meth:`LazyCommand.load`),
        or None when there is none."""
        command = self.commands.get(cmd_name)
        if isinstance(command, _StandIn):
            command = self.commands[cmd_name] = command.lazy.load(self)
        return command

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        """The commands of the help, one heading per :attr:`sections` entry, from the commands as they are
        now (stand-ins list their summary), so that showing the help imports no command. Each section is
        typer's own "Commands" listing under its heading."""
        of = {lazy.name: lazy.section for lazy in self.lazy_commands}
        known = [key for key, _ in self.sections]
        groups = [(heading, [n for n in self.commands if of.get(n) == key]) for key, heading in self.sections]
        groups.append(("Commands", [n for n in self.commands if of.get(n, "") not in known]))
        width = max((len(name) for name in self.commands), default=0)
        for heading, names in groups:
            rows = [(name.ljust(width), self.commands[name].get_short_help_str(max(formatter.width - 6 - width, 10)))
                    for name in names if not self.commands[name].hidden]  # one alignment for every section
            if rows:
                with formatter.section(heading):
                    formatter.write_dl(rows)

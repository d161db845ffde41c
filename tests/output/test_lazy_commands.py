"""The root command imports a command's module only when that command is used (pgflow_cli/cli/lazy.py),
and what it shows before loading anything is what the loaded commands would show."""

from __future__ import annotations

import pytest
import typer
import typer.main

from pgflow_cli.cli import COMMANDS, app
from pgflow_cli.errors import ExitCode
from tests.support.cli import run_cli, run_cli_imports

COMMAND_MODULES = {command.module for command in COMMANDS}
HEAVY = ("psycopg", "rich", "tabulate", "pgflow_cli.operations", "pgflow_cli.db", "pgflow_cli.render")


def _loaded(modules: set[str]) -> set[str]:
    return modules & COMMAND_MODULES


def _heavy(modules: set[str]) -> set[str]:
    return {name for name in modules if name.startswith(HEAVY)}


@pytest.mark.parametrize("args", [["--help"], ["--version"], [], ["no-such-command"], ["statu"]])
def test_the_root_alone_imports_no_command_and_neither_psycopg_nor_rich(args, tmp_path):
    result, modules = run_cli_imports(*args, workdir=tmp_path)
    assert result.code in (ExitCode.OK, ExitCode.USAGE), result.output
    assert _loaded(modules) == set()
    assert _heavy(modules) == set()


@pytest.mark.parametrize("command", COMMANDS, ids=[c.name for c in COMMANDS])
def test_a_command_imports_its_own_module_and_no_other_command(command, tmp_path):
    result, modules = run_cli_imports(command.name, "--help", workdir=tmp_path)
    assert result.code == ExitCode.OK, result.output
    assert _loaded(modules) == {command.module}


def test_a_real_command_imports_only_its_module(tmp_path):
    result, modules = run_cli_imports("audit", "--print-sql", workdir=tmp_path)
    assert result.code == ExitCode.OK and "pgflow" in result.stdout, result.output
    assert _loaded(modules) == {"pgflow_cli.cli.audit"}
    assert "pgflow_cli.operations.drop_flow" not in modules and "pgflow_cli.worker" not in modules


def _root() -> typer.core.TyperGroup:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    return group


def _help(group: typer.core.TyperGroup, width: int) -> str:
    ctx = typer.Context(group, info_name="pgflow", terminal_width=width)
    return group.get_help(ctx)


def test_the_summaries_are_the_first_sentence_of_each_commands_help():
    standing, loaded = _root(), _root()
    ctx = typer.Context(loaded, info_name="pgflow")
    for command in COMMANDS:
        real = loaded.get_command(ctx, command.name)
        assert real is not None and real is not standing.commands[command.name]
        first_sentence = real.get_short_help_str(10**6)
        assert command.summary == first_sentence, (
            f"COMMANDS in pgflow_cli/cli/__init__.py: the summary of {command.name} must be the first sentence "
            f"of its help, {first_sentence!r}")
        assert standing.commands[command.name].get_short_help_str(10**6) == first_sentence


@pytest.mark.parametrize("width", [60, 80, 100, 200])
def test_the_root_help_before_loading_is_the_help_after_loading_everything(width):
    standing, loaded = _root(), _root()
    ctx = typer.Context(loaded, info_name="pgflow")
    for command in COMMANDS:
        loaded.get_command(ctx, command.name)
    assert _help(standing, width) == _help(loaded, width)
    assert all(name in _help(standing, width) for name in loaded.list_commands(ctx))


def test_a_misspelt_command_still_gets_a_suggestion():
    result = run_cli("statu")
    assert result.code == ExitCode.USAGE
    assert "No such command 'statu'. Did you mean 'status'?" in result.stderr
    assert "Traceback" not in result.output


def test_the_listing_is_in_the_registered_order():
    group = _root()
    assert group.list_commands(typer.Context(group)) == [command.name for command in COMMANDS]


def test_the_root_help_groups_the_commands_by_lifecycle():
    """Issue 29: upgrade, deploy, run, inspect, develop, each command under its section, in that order."""
    from pgflow_cli.cli import SECTIONS

    text = _help(_root(), 100)
    headings = [heading for _key, heading in SECTIONS]
    positions = [text.index(heading + ":") for heading in headings]
    assert positions == sorted(positions) and [key for key, _ in SECTIONS] == \
        ["upgrade", "deploy", "run", "inspect", "develop"]
    bounds = [*positions, len(text)]
    for command in COMMANDS:
        index = [key for key, _ in SECTIONS].index(command.section)
        assert f"\n  {command.name} " in text[bounds[index]:bounds[index + 1]], command.name

"""Exit codes, --help and error reporting of the command line as a whole."""

import pytest

from pgflow_cli.cli import COMMANDS
from pgflow_cli.errors import ExitCode
from tests.support.cli import run_cli


def test_exit_code_table_is_fixed():
    assert {code.name: int(code) for code in ExitCode} == {
        "OK": 0, "FINDINGS": 1, "USAGE": 2, "CONNECTION": 3, "LOCK_TIMEOUT": 4,
        "DEADLINE": 5, "CONFLICT": 6, "INTERNAL": 70, "INTERRUPTED": 130,
    }


def test_help_lists_every_exit_code():
    result = run_cli("--help")
    assert result.code == 0
    for code in ExitCode:
        assert f"{int(code):>4}  {code.meaning}" in result.stdout


def test_unknown_command_is_usage_error():
    result = run_cli("no-such-command")
    assert result.code == ExitCode.USAGE
    assert "No such command" in result.stderr


def test_version():
    result = run_cli("--version")
    assert result.code == 0 and result.stdout.startswith("pgflow-cli ")


@pytest.mark.parametrize("args", [["sandbox", "dsn"]])
def test_sandbox_not_running_is_exit_3(tmp_path, args):
    result = run_cli(*args, env={"PGFLOW_SANDBOX_DIR": str(tmp_path / "sbx")})
    assert result.code == ExitCode.CONNECTION
    assert "pgflow sandbox up" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", [c.name for c in COMMANDS])
def test_no_command_uses_a_deprecated_typer_api(command):
    """typer warns (DeprecationWarning) when a command is built with an API it will remove, e.g. the
    optional-value option ``is_flag=False, flag_value=``; as errors here, such a warning fails."""
    result = run_cli(command, "--help", env={"PYTHONWARNINGS": "error::DeprecationWarning"})
    assert result.code == 0, result.output
    assert "Warning" not in result.output

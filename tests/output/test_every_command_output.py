"""Issue 16 item 3 across the commands: at 60, 80 and 200 columns, piped, NO_COLOR and on an ASCII stdout,
every report command prints within the width, without escape codes or trailing spaces, and never crashes."""

from __future__ import annotations

import pytest

from tests.output.helpers import seed
from tests.support.cli import run_cli

COMMANDS = {
    "audit": ["audit"],
    "migrate status": ["migrate", "status"],
    "migrate plan": ["migrate", "plan"],
    "coverage": ["coverage"],
    "fence status": ["fence", "status"],
    "fence disable": ["fence", "disable", "--function", "review-worker", "-m", "check", "--dry-run"],
    "drop-flow": ["drop-flow", "review", "--dry-run", "--force"],
    "task list": ["task", "list"],
}


@pytest.fixture(scope="module")
def seeded(harness):
    from pgflow_cli import installer  # noqa: F401  (the template is built by tests.conftest._install)
    from tests.conftest import _install
    from tests.output.helpers import fixed_database

    database = fixed_database(harness, harness.template("latest", lambda c: _install(c, None)), "output_widths")
    seed(database)
    yield database
    harness.drop(database)


@pytest.mark.parametrize("width", [60, 80, 200])
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_reports_fit_the_width_without_escapes_or_padding(seeded, name, width):
    args = COMMANDS[name]
    fmt = ["--format", "table"]
    result = run_cli(*args, "--dsn", seeded.conninfo, *fmt, env={"COLUMNS": str(width), "NO_COLOR": "1"})
    assert result.code in (0, 1), result.output
    assert "\x1b" not in result.output
    lines = result.stdout.splitlines()
    assert lines, result.output
    too_long = [line for line in lines if len(line) > width and "--dsn" not in line]
    assert too_long == [], "\n".join(too_long)
    assert all(line == line.rstrip() for line in lines)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_reports_piped_and_on_an_ascii_stdout(seeded, name):
    args = COMMANDS[name]
    plain = run_cli(*args, "--dsn", seeded.conninfo)
    assert plain.code in (0, 1), plain.output
    assert "\x1b" not in plain.output and all(line == line.rstrip() for line in plain.stdout.splitlines())
    ascii_run = run_cli(*args, "--dsn", seeded.conninfo, env={"PYTHONIOENCODING": "ascii"})
    assert ascii_run.code == plain.code, ascii_run.output
    assert ascii_run.stdout.isascii() and ascii_run.stderr.isascii()
    assert "Traceback" not in ascii_run.output

"""Issue 16 item 3 across the commands: at 60, 80 and 200 columns, piped, NO_COLOR and on an ASCII stdout,
every report command prints within the width, without escape codes or trailing spaces, and never crashes."""

from __future__ import annotations

import pytest

from pgflow_cli.worker import Flow, protocol
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
    "status": ["status"],
    "runs list": ["runs", "list"],
    "runs show": ["runs", "show", "{run_id}"],
    "runs start": ["runs", "start", "review"],
    "runs wait": ["runs", "wait", "{ended_run_id}"],
}
"""Every report command; ``{run_id}`` is the seeded run of flow ``review``, ``{ended_run_id}`` a run of
flow ``instant`` (it completes as it starts: its one step's condition is not met)."""


@pytest.fixture(scope="module")
def seeded(harness):
    from pgflow_cli import installer  # noqa: F401  (the template is built by tests.conftest._install)
    from tests.conftest import _install
    from tests.output.helpers import fixed_database

    database = fixed_database(harness, harness.template("latest", lambda c: _install(c, None)), "output_widths")
    seed(database)
    instant = Flow("instant").step("gate", lambda value, ctx: value, if_={"go": True})
    with database.connect() as conn:
        protocol.ProtocolV2().compile(conn, instant.slug, instant.shape(), None)
        conn.execute("SELECT pgflow.start_flow('instant', '{}')")
    yield database
    harness.drop(database)


def _args(seeded, name):
    with seeded.connect() as conn:
        run_id, ended = (str(conn.execute("SELECT run_id FROM pgflow.runs WHERE flow_slug = %s ORDER BY started_at",
                                          (flow,)).fetchone()[0]) for flow in ("review", "instant"))
    return [arg.replace("{run_id}", run_id).replace("{ended_run_id}", ended) for arg in COMMANDS[name]]


@pytest.mark.parametrize("width", [60, 80, 200])
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_reports_fit_the_width_without_escapes_or_padding(seeded, name, width):
    args = _args(seeded, name)
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
    args = _args(seeded, name)
    plain = run_cli(*args, "--dsn", seeded.conninfo)
    assert plain.code in (0, 1), plain.output
    assert "\x1b" not in plain.output and all(line == line.rstrip() for line in plain.stdout.splitlines())
    ascii_run = run_cli(*args, "--dsn", seeded.conninfo, env={"PYTHONIOENCODING": "ascii"})
    assert ascii_run.code == plain.code, ascii_run.output
    assert ascii_run.stdout.isascii() and ascii_run.stderr.isascii()
    assert "Traceback" not in ascii_run.output


@pytest.mark.parametrize("fmt", ["plain", "markdown"])
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_reports_as_plain_text_and_markdown(seeded, name, fmt):
    """Every report command has the two tabulate formats: no escape codes, no trailing spaces, every
    column (nothing is left out for width, even at 60 columns)."""
    result = run_cli(*_args(seeded, name), "--dsn", seeded.conninfo, "--format", fmt,
                     env={"COLUMNS": "60", "TERM": "xterm-256color"})
    assert result.code in (0, 1), result.output
    assert "\x1b" not in result.output and "left out at" not in result.stdout
    lines = result.stdout.splitlines()
    assert lines and all(line == line.rstrip() for line in lines)
    if fmt == "markdown":
        has_table = {"status", "runs list", "runs show", "coverage", "drop-flow", "fence disable"}
        assert any(line.startswith("| ") for line in lines) or name not in has_table, result.stdout

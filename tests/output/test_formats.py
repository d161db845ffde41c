"""Issue 16 item 3: tables readable at 60/80/200 columns, plain/markdown formats, no trailing padding when
piped, no escape codes with NO_COLOR or off a terminal, ASCII on a non-UTF-8 stdout, --debug anywhere."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys

import pytest

from pgflow_cli import installer
from pgflow_cli.errors import ExitCode
from tests.audit.helpers import define_flow
from tests.support.cli import run_cli

ESCAPE = re.compile(r"\x1b")
STATES = ("applied", "pending")


def _status(database, *args: str, **env: str):
    return run_cli("migrate", "status", "--dsn", database.conninfo, *args, env=env)


@pytest.mark.parametrize("width", [60, 80, 200])
def test_migrate_status_table_fits_the_width_and_never_cuts_a_state(baseline_db, width):
    result = _status(baseline_db, "--format", "table", COLUMNS=str(width))
    assert result.code == ExitCode.OK, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= width, "\n".join(lines)
    rows = [line for line in lines if re.search(r"\b00\d\d_", line)]
    assert len(rows) == len(installer.available_migrations())
    for row in rows:  # every migration row carries its whole state word
        assert any(re.search(rf"\b{state}\b", row) for state in STATES), row
    assert all(line == line.rstrip() for line in lines), "trailing spaces when piped"
    if width == 200:
        assert "summary" in result.stdout and "applied (UTC)" in result.stdout and "left out" not in result.stdout
    else:
        assert f"(left out at {width} columns:" in " ".join(result.stdout.split())
    if width == 80:  # the summary is kept (wrapped) at 80; the less useful columns go first
        assert "summary" in result.stdout and "tool" not in lines[1]


def test_piped_default_is_plain_tabulate_without_padding_or_escapes(baseline_db):
    default = _status(baseline_db, COLUMNS="80")
    plain = _status(baseline_db, "--format", "plain", COLUMNS="80")
    assert default.code == plain.code == ExitCode.OK
    assert default.stdout == plain.stdout
    lines = plain.stdout.splitlines()
    assert not ESCAPE.search(plain.stdout)
    assert all(line == line.rstrip() for line in lines)
    header = next(line for line in lines if line.startswith("migration "))
    assert header.split() == ["migration", "state", "applied", "(UTC)", "by", "tool", "s", "summary"]
    # one row per line: grep finds a migration with its state on one line
    assert [line.split()[:2] for line in lines if line.startswith("0003_")] == [["0003_queue_stage", "pending"]]
    assert "│" not in plain.stdout and "┃" not in plain.stdout


def test_markdown_is_a_pipe_table(baseline_db):
    result = _status(baseline_db, "--format", "markdown")
    assert result.code == ExitCode.OK
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| migration"))
    assert re.fullmatch(r"\|[-|]+\|", lines[header + 1])
    assert any(line.startswith("| 0003_queue_stage ") and "| pending " in line for line in lines)
    assert not ESCAPE.search(result.stdout)


def _on_a_terminal(args: list[str], env: dict[str, str]) -> str:
    """Run pgflow with stdout on a pseudo-terminal and return what it printed there."""
    main, secondary = pty.openpty()
    base = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "NO_COLOR"}
    base.update({"COLUMNS": "120", "TERM": "xterm-256color", **env})
    proc = subprocess.Popen([sys.executable, "-m", "pgflow_cli", *args], stdout=secondary,
                            stderr=subprocess.PIPE, env=base)
    os.close(secondary)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=120)
    os.close(main)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    return b"".join(chunks).decode()


def test_no_color_removes_every_escape_code_on_a_terminal(baseline_db):
    args = ["migrate", "status", "--dsn", baseline_db.conninfo]
    coloured = _on_a_terminal(args, {"FORCE_COLOR": "1"})
    assert ESCAPE.search(coloured), "a terminal gets colours (else this test proves nothing)"
    plain = _on_a_terminal(args, {"NO_COLOR": "1"})
    assert not ESCAPE.search(plain)
    assert "0003_queue_stage" in plain and "┏" in plain  # still the table format on a terminal


@pytest.mark.parametrize("fmt", ["table", "plain", "markdown"])
def test_ascii_stdout_degrades_to_ascii(baseline_db, fmt):
    conn = baseline_db.connect()
    define_flow(conn, "orders", ["ship"])
    for command in (["migrate", "status"], ["audit"]):
        result = run_cli(*command, "--dsn", baseline_db.conninfo, "--format", fmt,
                         env={"PYTHONIOENCODING": "ascii", "COLUMNS": "80"})
        assert result.code == ExitCode.OK, result.output
        assert "Traceback" not in result.output and "UnicodeEncodeError" not in result.output
        assert result.stdout.isascii() and result.stderr.isascii(), result.stdout
    audit = run_cli("audit", "--dsn", baseline_db.conninfo, "--format", fmt, env={"PYTHONIOENCODING": "ascii"})
    assert " - PGMQ " in audit.stdout  # the middle dot became an ASCII dash


def test_ascii_json_stays_valid_json(baseline_db):
    import json

    result = run_cli("audit", "--dsn", baseline_db.conninfo, "--format", "json", env={"PYTHONIOENCODING": "ascii"})
    assert result.code == ExitCode.OK and result.stdout.isascii()
    assert json.loads(result.stdout)["kind"] == "pgflow-cli/audit"


def test_unknown_values_are_said_in_words(baseline_db):
    conn = baseline_db.connect()
    define_flow(conn, "_hidden", ["ship"])  # a finding: its flow's impact line (archive never analysed) is shown
    result = run_cli("audit", "--dsn", baseline_db.conninfo, "--format", "plain")
    assert "?" not in result.stdout.replace("?)", "")  # no bare question marks for unknown values
    assert "unknown (not analysed)" in result.stdout


@pytest.mark.parametrize("position", ["after", "before"])
def test_debug_is_accepted_before_and_after_the_subcommand(baseline_db, position):
    tail = ["migrate", "status", "--dsn", baseline_db.conninfo]
    args = [*tail, "--debug"] if position == "after" else ["--debug", *tail]
    result = run_cli(*args)
    assert result.code == ExitCode.OK, result.output
    assert "No such option" not in result.output


def test_a_long_lock_list_in_a_dry_run_is_summarised_and_full_lists_it(baseline_db):
    short = run_cli("migrate", "apply", "--dry-run", "--dsn", baseline_db.conninfo, "--format", "plain")
    full = run_cli("migrate", "apply", "--dry-run", "--full", "--dsn", baseline_db.conninfo, "--format", "plain")
    assert short.code == full.code == ExitCode.OK, short.output
    short_locks = [line for line in short.stdout.splitlines() if line.startswith("  lock ")]
    full_locks = [line for line in full.stdout.splitlines() if line.startswith("  lock ")]
    assert len(short_locks) == 5 < len(full_locks)
    assert re.search(r"\.\.\. and \d+ more lock\(s\) of \d+ in all .*--full lists every one", short.stdout)
    assert "more lock(s)" not in full.stdout

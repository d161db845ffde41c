"""Every command x schema level x closed stdout: the exit code docs/exit-codes.md gives.

The levels: a database without pgflow (and without PGMQ), the baseline (``installer.BASELINE_VERSION``,
the pre-upgrade state) and the newest (every migration). A command that needs what a level lacks exits 3
naming `pgflow migrate apply`, never 70 with a raw SQL error. Each command runs twice: with stdout
piped, and with a stdout whose reader has gone (as under `pgflow coverage | head -1` once `head` has
exited); the second ends silently with 141, what a shell reports for SIGPIPE, whenever the command
writes data, and else exactly as the first.

The commands come from the command line itself: a command added without a row here fails
:func:`test_every_command_is_in_the_matrix`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pgflow_cli import installer
from pgflow_cli.cli import CLOSED_STDOUT_EXIT
from tests.conftest import _install
from tests.support.cli import _clean_env, command_leaves, with_stack_dumps

ZERO_RUN = "00000000-0000-0000-0000-000000000000"
LEVELS = ("none", "baseline", "newest")


@dataclass(frozen=True)
class Case:
    """How to run a command on a database, and what it must exit with at each level.

    Attributes:
        args: the command line after ``pgflow`` (``--dsn`` is added); ``{newest}`` is the newest
            migration's number, ``{flows}`` a module defining flow ``hello``.
        codes: the exit code at ``none``, ``baseline`` and ``newest``.
        until_registered: a long-running command (a worker): stopped with SIGTERM once its worker row exists.
    """

    args: tuple[str, ...]
    codes: tuple[int, int, int]
    until_registered: bool = False


MATRIX: dict[tuple[str, ...], Case] = {
    ("audit",): Case(("audit",), (3, 0, 0)),
    ("coverage",): Case(("coverage",), (3, 0, 0)),
    ("status",): Case(("status",), (3, 0, 0)),
    ("drop-flow",): Case(("drop-flow", "nope", "--dry-run"), (3, 3, 6)),
    ("prune",): Case(("prune", "--older-than", "30d", "--dry-run"), (3, 3, 0)),
    ("worker",): Case(("worker", "{flows}:hello", "--heartbeat-interval", "0.2"), (3, 6, 0), until_registered=True),
    ("migrate", "status"): Case(("migrate", "status"), (0, 0, 0)),
    ("migrate", "plan"): Case(("migrate", "plan"), (0, 0, 0)),
    ("migrate", "apply"): Case(("migrate", "apply", "--dry-run"), (3, 0, 0)),
    ("migrate", "abort"): Case(("migrate", "abort", "{newest}", "--yes"), (6, 6, 6)),
    ("fence", "disable"): Case(("fence", "disable", "--function", "f", "-m", "why", "--dry-run"), (3, 3, 6)),
    ("fence", "restore"): Case(("fence", "restore", "--function", "f"), (3, 3, 6)),
    ("fence", "status"): Case(("fence", "status"), (3, 3, 0)),
    ("task", "list"): Case(("task", "list"), (3, 3, 0)),
    ("task", "show"): Case(("task", "show", ZERO_RUN, "s"), (3, 3, 6)),
    ("task", "complete"): Case(("task", "complete", ZERO_RUN, "s", "--output", "{}"), (3, 3, 6)),
    ("task", "fail"): Case(("task", "fail", ZERO_RUN, "s", "--error", "declined"), (3, 3, 6)),
    ("runs", "list"): Case(("runs", "list"), (3, 0, 0)),
    ("runs", "show"): Case(("runs", "show", ZERO_RUN), (3, 6, 6)),
    ("runs", "start"): Case(("runs", "start", "nope", "--input", "{}"), (3, 6, 6)),
    ("runs", "wait"): Case(("runs", "wait", ZERO_RUN), (3, 6, 6)),
    ("runs", "cancel"): Case(("runs", "cancel", ZERO_RUN, "--yes"), (3, 3, 6)),
    ("runs", "retry"): Case(("runs", "retry", ZERO_RUN), (3, 3, 6)),
    ("runs", "resume"): Case(("runs", "resume", ZERO_RUN), (3, 3, 6)),
    ("workers", "list"): Case(("workers", "list"), (3, 0, 0)),
    ("workers", "forget"): Case(("workers", "forget", "--stale-for", "1d", "--yes"), (3, 0, 0)),
    # the matrix connects as a superuser, whom the exporter refuses wherever pgflow's tables exist;
    # serving and stopping with exit 0 are tested in tests/observability/test_exporter.py
    ("exporter",): Case(("exporter", "--listen", "127.0.0.1:0"), (3, 2, 2)),
}
"""Every database command. The codes are docs/exit-codes.md's: 3 where the level lacks what the command
reads, 6 for a name that matches nothing (a flow, a task, a fence, a migration in progress), 6 for a
worker speaking a newer protocol than the baseline."""

SANDBOX: dict[tuple[str, ...], int] = {
    ("sandbox", "status"): 0,
    ("sandbox", "dsn"): 3,
    ("sandbox", "down"): 0,
}
"""Sandbox commands that need no server, on a sandbox directory that holds none: their exit code."""

ELSEWHERE = {
    ("sandbox", "up"): "starts a server (initdb): tests/test_sandbox.py",
    ("sandbox", "reset"): "starts a server (initdb): tests/test_sandbox.py",
    ("sandbox", "worker"): "needs a running sandbox: tests/test_sandbox.py",
}
"""Commands left out of the matrix, and where their exit codes are tested."""


def test_every_command_is_in_the_matrix():
    commands = set(command_leaves())
    assert commands == set(MATRIX) | set(SANDBOX) | set(ELSEWHERE), "add the command to tests/test_exit_matrix.py"


@dataclass
class Levels:
    conninfo: dict[str, str] = field(default_factory=dict)
    flows: Path | None = None


@pytest.fixture(scope="module")
def levels(harness, tmp_path_factory):
    """One database per level (the commands here change nothing that another command would see)."""
    made = {
        "none": harness.clone(None, "matrix_none"),
        "baseline": harness.clone(harness.template("baseline", lambda c: _install(c, installer.BASELINE_VERSION)),
                                  "matrix_baseline"),
        "newest": harness.clone(harness.template("latest", lambda c: _install(c, None)), "matrix_newest"),
    }
    flows = tmp_path_factory.mktemp("matrix") / "matrix_flows.py"
    flows.write_text("from pgflow_cli.worker import Flow\n\nhello = Flow('hello').step('greet', lambda i, c: i)\n")
    yield Levels({level: database.conninfo for level, database in made.items()}, flows)
    for database in made.values():
        harness.drop(database)


def _closed_stdout() -> int:
    """A pipe's write end whose read end is already closed: every write meets EPIPE."""
    read, write = os.pipe()
    os.close(read)
    return write


def _run(args: list[str], *, closed: bool, env: dict[str, str], conninfo: str | None,
         until_registered: bool) -> tuple[int, str, str]:
    stdout = _closed_stdout() if closed else subprocess.PIPE
    child = subprocess.Popen([sys.executable, "-m", "pgflow_cli", *args], stdout=stdout, stderr=subprocess.PIPE,
                             text=True, env=with_stack_dumps(env))
    if closed:
        os.close(stdout)  # type: ignore[arg-type]
    if until_registered and conninfo is not None:
        import psycopg

        with psycopg.connect(conninfo, autocommit=True) as watcher:
            deadline = time.monotonic() + 60
            while child.poll() is None and time.monotonic() < deadline:
                if watcher.execute("SELECT to_regclass('pgflow.workers') IS NOT NULL").fetchone()[0] and \
                        watcher.execute("SELECT EXISTS (SELECT 1 FROM pgflow.workers WHERE stopped_at IS NULL)")\
                        .fetchone()[0]:
                    child.send_signal(signal.SIGTERM)
                    break
                time.sleep(0.05)
    try:
        out, err = child.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        raise AssertionError(f"pgflow {' '.join(args)} did not end: {err[-3000:]}") from None
    return child.returncode, out or "", err


def _check(code: int, stdout: str, stderr: str, expected: int, closed: bool, wrote: bool) -> None:
    shown = f"exit {code}, stderr:\n{stderr[-2000:]}"
    assert "Traceback" not in stderr and "internal error" not in stderr, shown
    if closed and wrote:
        assert code == CLOSED_STDOUT_EXIT, shown
        assert "Broken pipe" not in stderr and "BrokenPipe" not in stderr and "Exception ignored" not in stderr, shown
        return
    assert code == expected, shown


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("command", sorted(MATRIX), ids=" ".join)
def test_exit_code(levels, command, level):
    case = MATRIX[command]
    newest = str(installer.available_migrations()[-1].version)
    args = [a.replace("{newest}", newest).replace("{flows}", str(levels.flows)) for a in case.args]
    conninfo = levels.conninfo[level]
    expected = case.codes[LEVELS.index(level)]
    env = {**_clean_env(), "COLUMNS": "200", "PGFLOW_NO_PASSWORD_PROMPT": "1"}
    code, stdout, stderr = _run([*args, "--dsn", conninfo], closed=False, env=env, conninfo=conninfo,
                                until_registered=case.until_registered)
    _check(code, stdout, stderr, expected, closed=False, wrote=bool(stdout))
    if code == 3 and level != "newest":  # the command that adds what is missing (PGMQ: its option)
        assert "pgflow migrate apply" in stderr or (command == ("migrate", "apply") and "--install-pgmq" in stderr), \
            stderr
    if level == "newest" and case.until_registered:
        with __import__("psycopg").connect(conninfo, autocommit=True) as conn:
            conn.execute("DELETE FROM pgflow.workers")  # the next run registers afresh
    closed = _run([*args, "--dsn", conninfo], closed=True, env=env, conninfo=conninfo,
                  until_registered=case.until_registered)
    _check(*closed, expected, closed=True, wrote=bool(stdout))
    if level == "newest" and case.until_registered:
        with __import__("psycopg").connect(conninfo, autocommit=True) as conn:
            conn.execute("DELETE FROM pgflow.workers")


@pytest.mark.parametrize("level", ["none", "baseline"])
def test_a_missing_stage_is_told_apart_in_json(levels, level):
    """The JSON error says why (reason) besides the code, in the common document shape."""
    from tests.support.schemas import validate

    env = {**_clean_env(), "COLUMNS": "200"}
    code, _out, err = _run(["task", "list", "--format", "json", "--dsn", levels.conninfo[level]], closed=False,
                           env=env, conninfo=None, until_registered=False)
    assert code == 3, err
    error = json.loads(err)
    validate(error, "error")
    assert (error["kind"], error["reason"]) == ("pgflow-cli/error", {"none": "schema_missing",
                                                                     "baseline": "schema_behind"}[level])


@pytest.mark.parametrize("command", sorted(SANDBOX), ids=" ".join)
def test_sandbox_commands_without_a_sandbox(tmp_path, command):
    env = {**_clean_env(), "COLUMNS": "200", "PGFLOW_SANDBOX_DIR": str(tmp_path / "sandbox")}
    code, stdout, stderr = _run(list(command), closed=False, env=env, conninfo=None, until_registered=False)
    _check(code, stdout, stderr, SANDBOX[command], closed=False, wrote=bool(stdout))
    _check(*_run(list(command), closed=True, env=env, conninfo=None, until_registered=False),
           SANDBOX[command], closed=True, wrote=bool(stdout))

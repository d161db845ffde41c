"""A `next:` line printed for a password-protected server (SCRAM, over TCP) works when pasted: on a
terminal the pasted command asks for the password, as psql does; elsewhere it connects once the
password is supplied the way the line says (PGPASSWORD), and without it fails saying how to supply it."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pgflow_cli.cli.common import PASSWORD_LEFT_OUT
from pgflow_cli.errors import ExitCode
from tests.support.cli import _clean_env, run_cli

BIN = str(Path(sys.executable).parent)
"""Where this install's `pgflow` console script is: a pasted line starts with `pgflow`."""


@pytest.fixture
def paged(db):
    """Two runs, so `runs list --limit 1` prints a `next:` line; and the database's SCRAM conninfo."""
    conn = db.connect()
    conn.execute("SELECT pgflow.create_flow('orders')")
    conn.execute("SELECT pgflow.add_step('orders', 'work')")
    for _ in range(2):
        conn.execute("SELECT pgflow.start_flow('orders', '{}'::jsonb)")
    return db.server.conninfo(db.name, tcp=True), db.server.config.password


def _next_line(conninfo: str, password: str) -> str:
    listed = run_cli("runs", "list", "--limit", "1", "--dsn", f"{conninfo} password={password}", "--format", "plain")
    assert listed.code == ExitCode.OK, listed.output
    assert password not in listed.output
    line = next(line for line in listed.stdout.splitlines() if line.startswith("next: "))
    assert line.endswith(f" ({PASSWORD_LEFT_OUT})"), line  # says how to supply the password left out
    return line.removeprefix("next: ").removesuffix(f" ({PASSWORD_LEFT_OUT})")


def _shell_env(**extra: str) -> dict[str, str]:
    return {**_clean_env(), "PATH": BIN + os.pathsep + os.environ.get("PATH", ""), "COLUMNS": "200", **extra}


def test_pasted_with_pgpassword_it_connects(paged):
    conninfo, password = paged
    command = _next_line(conninfo, password)
    pasted = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120,
                            env=_shell_env(PGPASSWORD=password))
    assert pasted.returncode == ExitCode.OK, pasted.stderr
    assert "1 run(s); no more" in pasted.stdout


def test_pasted_without_the_password_off_a_terminal_says_how_to_supply_it(paged):
    conninfo, password = paged
    command = _next_line(conninfo, password)
    pasted = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL, env=_shell_env())
    assert pasted.returncode == ExitCode.CONNECTION, pasted.stderr
    assert "wants a password" in pasted.stderr and "PGPASSWORD" in pasted.stderr


def _on_a_terminal(command: str, answer: str, env: dict[str, str], timeout: float = 120) -> tuple[int, str]:
    """Run ``command`` in bash on a pseudo-terminal, type ``answer`` at the password prompt."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: bash on the terminal
        os.execvpe("bash", ["bash", "-c", command], env)
    output, answered, deadline = b"", False, time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1)
            if not ready:
                continue
            try:
                data = os.read(fd, 4096)
            except OSError:  # the terminal closed: the child ended
                break
            if not data:
                break
            output += data
            if not answered and b"Password for user" in output:
                os.write(fd, answer.encode() + b"\n")
                answered = True
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), output.decode("utf-8", "replace")


def test_pasted_on_a_terminal_it_asks_for_the_password(paged):
    conninfo, password = paged
    command = _next_line(conninfo, password)
    code, shown = _on_a_terminal(command, password, _shell_env(TERM="dumb", NO_COLOR="1"))
    assert "Password for user postgres:" in shown
    assert code == ExitCode.OK, shown
    assert re.search(r"1 run\(s\); no more", shown), shown
    assert password not in shown  # not echoed, not printed


def test_a_wrong_password_typed_at_the_prompt_is_a_wrong_password(paged):
    conninfo, password = paged
    code, shown = _on_a_terminal(f"pgflow runs list --dsn '{conninfo}'", "not-" + password,
                                 _shell_env(TERM="dumb", NO_COLOR="1"))
    assert code == ExitCode.CONNECTION, shown
    assert "refused the password" in shown and "not-" + password not in shown

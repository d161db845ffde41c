"""Run the real ``pgflow`` command in a subprocess and capture exit code, stdout and stderr."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120, input: str | None = None) -> CliResult:
    """Run ``python -m pgflow_cli ARGS`` with a clean connection environment.

    ``env`` entries are added to a copy of the current environment from which the
    connection variables (PG*, DATABASE_URL, PGFLOW_DATABASE_URL) were removed, so a
    test only reaches the database it names.
    """
    base = _clean_env()
    base.setdefault("COLUMNS", "200")
    base.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "pgflow_cli", *args],
        capture_output=True,
        text=True,
        env=base,
        timeout=timeout,
        input=input,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


_IMPORTS_DRIVER = """\
import atexit, json, sys
atexit.register(lambda: open(sys.argv[1], "w").write(json.dumps(sorted(sys.modules))))
from pgflow_cli.cli import main
main(sys.argv[2:])
"""


def run_cli_imports(*args: str, workdir: Path, env: dict[str, str] | None = None) -> tuple[CliResult, set[str]]:
    """Run the command line's entry point (:func:`pgflow_cli.cli.main`) with ``ARGS`` in a fresh
    interpreter, as :func:`run_cli` does, and also return every module it had imported when it exited.

    Args:
        args: the command line after ``pgflow``.
        workdir: a directory for the list of modules (one file, ``imports.json``).
        env: variables added to the clean environment.

    Returns:
        The result and the names in the child's ``sys.modules`` at exit.
    """
    listing = workdir / "imports.json"
    proc = subprocess.run([sys.executable, "-c", _IMPORTS_DRIVER, str(listing), *args],
                          capture_output=True, text=True, env={**_clean_env(), "COLUMNS": "200", **(env or {})},
                          timeout=120)
    return CliResult(proc.returncode, proc.stdout, proc.stderr), set(json.loads(listing.read_text()))


def sigint_as_at_a_terminal() -> None:
    """``preexec_fn`` for a child a test will Ctrl-C: SIGINT back to its default disposition.

    A process inherits an *ignored* SIGINT (a background job of a non-interactive shell, e.g.
    ``pytest ... &`` in a script or CI step), and Python then never installs the handler that
    turns SIGINT into KeyboardInterrupt: the command would never see the test's Ctrl-C. A
    command an operator starts at a terminal has the default disposition; this gives it that.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signal_dispositions(pid: int) -> str:
    """The SigBlk/SigIgn/SigCgt masks of ``pid`` (Linux /proc; bit 2 = SIGINT), or "" elsewhere."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            return " ".join(line.strip() for line in status if line.startswith(("SigBlk", "SigIgn", "SigCgt")))
    except OSError:
        return ""


def with_stack_dumps(env: dict[str, str]) -> dict[str, str]:
    """``env`` plus PYTHONFAULTHANDLER=1, so that :func:`dump_stacks_and_kill` can show where a child hangs."""
    return {**env, "PYTHONFAULTHANDLER": "1"}


def dump_stacks_and_kill(popen: subprocess.Popen, read_stderr: Callable[[], str] | None = None) -> str:
    """End a child started with :func:`with_stack_dumps` that did not exit in time, and return the tail
    of its stderr holding every thread's Python stack.

    The child's signal masks come first (SIGINT ignored or blocked shows there), then
    SIGABRT makes faulthandler write the stacks to the child's stderr before it dies (SIGKILL
    after 30 s if it still lives). ``read_stderr`` returns what a reader thread collected; without it
    the remaining output is read with ``communicate``.
    """
    masks = _signal_dispositions(popen.pid)
    popen.send_signal(signal.SIGABRT)
    err: str | None = None
    try:
        if read_stderr is None:
            err = popen.communicate(timeout=30)[1]
        else:
            popen.wait(timeout=30)
    except subprocess.TimeoutExpired:
        popen.kill()
        err = popen.communicate()[1] if read_stderr is None else None
    text = read_stderr() if read_stderr is not None else (err or "")
    return f"signal masks before SIGABRT: {masks}\n{text[-6000:]}"


def communicate_or_dump(popen: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """``popen.communicate(timeout=...)``; on a timeout, fail with the child's stacks (see
    :func:`dump_stacks_and_kill`) instead of a bare TimeoutExpired."""
    try:
        return popen.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = dump_stacks_and_kill(popen)
    raise AssertionError(f"{popen.args!r} did not exit within {timeout} s; its stderr and stacks:\n{stacks}")


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not (k.startswith("PG") or k in ("DATABASE_URL",))}


def kill_cli_when(conninfo: str, *args: str, ready: Callable[[psycopg.Connection], bool],
                  what: str, timeout: float = 240) -> CliResult:
    """Run ``python -m pgflow_cli ARGS``, SIGKILL it as soon as ``ready(watcher)`` is true, and
    wait until every session of it has left the database ``conninfo`` names.

    Args:
        conninfo: the database the command works on (a watcher connection polls it, autocommit).
        args: the command's arguments.
        ready: polled every 5 ms on the watcher connection; the client must still be running.
        what: the moment waited for, in words (the failure message when it never comes).
        timeout: seconds for each wait.

    Returns:
        The killed client's exit code (``-SIGKILL``) and output.
    """
    client = subprocess.Popen([sys.executable, "-m", "pgflow_cli", *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_clean_env())
    watcher = psycopg.connect(conninfo, autocommit=True)
    try:
        deadline = time.monotonic() + timeout
        while not ready(watcher):
            assert client.poll() is None, f"the client ended before {what}: {client.communicate()}"
            assert time.monotonic() < deadline, f"the client never reached {what}"
            time.sleep(0.005)
        client.send_signal(signal.SIGKILL)
        client.wait(30)
        deadline = time.monotonic() + timeout
        while watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                              "AND pid <> pg_backend_pid()").fetchone()[0]:
            assert time.monotonic() < deadline, "the killed client's backend never ended"
            time.sleep(0.05)
    finally:
        watcher.close()
        if client.poll() is None:
            client.kill()
        stdout, stderr = client.communicate()
    return CliResult(client.returncode, stdout, stderr)


def command_leaves() -> dict[tuple[str, ...], object]:
    """Every command of ``pgflow`` that runs (not a group), by its path (``("migrate", "status")``), read
    from the command line itself (imports every command module)."""
    import typer

    from pgflow_cli.cli import app

    def leaves(group, ctx, prefix=()):
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            if hasattr(command, "list_commands"):
                yield from leaves(command, ctx, (*prefix, name))
            else:
                yield (*prefix, name), command

    root = typer.main.get_command(app)
    return dict(leaves(root, root.make_context("pgflow", ["--help"], resilient_parsing=True)))

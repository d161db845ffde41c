"""Run the real ``pgflow`` command in a subprocess and capture exit code, stdout and stderr."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

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


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not (k.startswith("PG") or k in ("DATABASE_URL",))}


def kill_cli_when(conninfo: str, *args: str, ready: Callable[[psycopg.Connection], bool],
                  what: str, timeout: float = 60) -> CliResult:
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

"""Run the real ``pgflow`` command in a subprocess and capture exit code, stdout and stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass


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
    base = {k: v for k, v in os.environ.items() if not (k.startswith("PG") or k in ("DATABASE_URL",))}
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

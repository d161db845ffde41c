"""Helpers of the Stage 2 tests: the real `pgflow worker` command as a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.worker.helpers import REPO, WorkerProcess, wait_until

FLOWS = Path(__file__).with_name("flows_module.py")


def clean_env(extra: dict | None = None) -> dict:
    """The environment without connection variables (a test reaches only the database it names)."""
    env = {k: v for k, v in os.environ.items() if not (k.startswith("PG") or k == "DATABASE_URL")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class CliWorker(WorkerProcess):
    """`pgflow worker ...` in its own process; ``worker_id`` is read from its startup log line."""

    @classmethod
    def start(cls, conninfo: str, target: str, *args: str, env: dict | None = None) -> CliWorker:
        popen = subprocess.Popen(
            [sys.executable, "-m", "pgflow_cli", "worker", target, "--dsn", conninfo, "--heartbeat-interval", "0.3",
             "--drain-timeout", "30", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(env), cwd=str(REPO),
        )
        return cls(popen, "")

    def wait_started(self) -> str:
        """Wait for the runner's 'started' line (registered, polling); returns the worker id."""
        line = self.wait_for_line(" started: flow=", which="stderr")
        self.worker_id = re.search(r"worker (\S+) started:", line).group(1)
        return self.worker_id

    def wait_exit(self) -> int:
        wait_until(lambda: self.popen.poll() is not None, "the worker process to exit",
                   describe=lambda: "\n".join(self.lines("stderr")[-20:]))
        return self.popen.returncode


def flow_target(name: str) -> str:
    return f"{FLOWS}:{name}"

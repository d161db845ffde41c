"""Helpers of the fence tests: the gated flow, worker processes, the `pgflow fence` CLI in a
subprocess, and waits on real database state.

Workers are real reference-worker processes (tests/fence/fence_worker.py) polling the test's
database; the CLI is the real ``python -m pgflow_cli``. Nothing is mocked. Waits have generous
deadlines that only turn a hang into a readable failure; no test asserts how long anything took.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgflow_cli.worker import Flow, TaskContext
from tests.support.cli import CliResult, dump_stacks_and_kill, sigint_as_at_a_terminal, with_stack_dumps
from tests.worker.helpers import DEADLINE, WorkerProcess, wait_until

REPO = Path(__file__).resolve().parents[2]
WORKER_SCRIPT = Path(__file__).with_name("fence_worker.py")
HEARTBEAT_INTERVAL = 0.2
"""Seconds between heartbeats of the test workers."""
WINDOW = "2"
"""--heartbeat-window of the tests' fence commands (10 missed test heartbeats)."""

__all__ = ["DEADLINE", "FenceEnv", "gated_flow", "wait_until"]


def _say(line: str) -> None:
    """Print one whole line in one write: print() writes the text and the newline separately, so two
    handler threads printing at once could interleave their lines (and hide a RAN line)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def gated_flow(slug: str, gate: Path) -> Flow:
    """``work`` (prints RAN, blocks until ``gate/<run_id>`` or ``gate/all`` exists) -> ``after``."""

    def work(run_input: Any, ctx: TaskContext) -> Any:
        _say(f"RAN {ctx.run_id} work {ctx.task_index} {ctx.worker_id}")
        deadline = time.monotonic() + DEADLINE * 3
        while not ((gate / ctx.run_id).exists() or (gate / "all").exists()):
            if time.monotonic() > deadline:
                raise TimeoutError("the test never opened the gate")
            time.sleep(0.02)
        return {"worked": run_input}

    def after(deps: Any, ctx: TaskContext) -> Any:
        _say(f"RAN {ctx.run_id} after {ctx.task_index} {ctx.worker_id}")
        return {"after": deps}

    # work's timeout (5 s) keeps a killed worker's task recoverable 35 s after its claim.
    return Flow(slug, max_attempts=3, base_delay=0).step("work", work, timeout=5).step("after", after, depends_on=["work"])


class WorkerProc(WorkerProcess):
    """One fence_worker.py process; stdout and stderr are collected by reader threads."""

    def __init__(self, popen: subprocess.Popen, worker_id: str, function_name: str, flow_slug: str) -> None:
        super().__init__(popen, worker_id)
        self.function_name = function_name
        self.flow_slug = flow_slug

    def ran(self) -> list[tuple[str, str, int]]:
        """(run_id, step, task_index) of every handler invocation this process printed."""
        out = []
        for line in self.lines():
            match = re.match(r"RAN (\S+) (\S+) (\d+) ", line)
            if match:
                out.append((match.group(1), match.group(2), int(match.group(3))))
        return out

    def exited(self) -> bool:
        return self.popen.poll() is not None

    def describe(self) -> str:
        return f"worker process {self.worker_id} ({self.function_name}) stderr:\n" + "\n".join(self.lines("stderr")[-20:])


class Cli:
    """A ``pgflow`` command running in the background (for the waits that fence disable does)."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [threading.Thread(target=self._pump, args=(s, sink), daemon=True)
                         for s, sink in ((popen.stdout, self.out), (popen.stderr, self.err))]
        for thread in self._threads:
            thread.start()

    def _pump(self, stream, sink: list[str]) -> None:
        for line in stream:
            sink.append(line)

    def finish(self, timeout: float = DEADLINE) -> CliResult:
        """Wait for the exit; on a timeout fail with the command's Python stacks (it runs with faulthandler)."""
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stacks = dump_stacks_and_kill(self.popen, self._collected_err)
            raise AssertionError(f"{self.popen.args!r} did not exit within {timeout} s; its stderr and stacks:\n"
                                 f"{stacks}") from None
        for thread in self._threads:
            thread.join(timeout=10)
        return CliResult(code, "".join(self.out), "".join(self.err))

    def _collected_err(self) -> str:
        for thread in self._threads:
            thread.join(timeout=10)
        return "".join(self.err)

    def interrupt(self) -> None:
        self.popen.send_signal(signal.SIGINT)


def _cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not (k.startswith("PG") or k == "DATABASE_URL")}
    env["COLUMNS"] = "200"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return with_stack_dumps(env)


class FenceEnv:
    """A fresh database, its worker processes and background CLI commands (all ended at teardown)."""

    def __init__(self, db, gate: Path) -> None:
        self.db = db
        self.conninfo: str = db.conninfo
        self.conn: psycopg.Connection = db.connect()
        self.conn.row_factory = dict_row
        self.gate = gate
        self.gate.mkdir(parents=True, exist_ok=True)
        self.procs: list[WorkerProc] = []
        self.clis: list[Cli] = []

    # -- SQL --------------------------------------------------------------------------------------
    def rows(self, query: str, params: Any = None) -> list[dict]:
        return self.conn.execute(query, params).fetchall()

    def val(self, query: str, params: Any = None) -> Any:
        row = self.conn.execute(query, params).fetchone()
        return None if row is None else next(iter(row.values()))

    def enabled(self, function_name: str) -> bool | None:
        return self.val("SELECT enabled FROM pgflow.worker_functions WHERE function_name = %s", (function_name,))

    def start_runs(self, flow_slug: str, count: int) -> list[str]:
        rows = self.rows("SELECT r.run_id FROM generate_series(1, %s) AS i, LATERAL pgflow.start_flow(%s, "
                         "jsonb_build_object('i', i)) AS r ORDER BY i", (count, flow_slug))
        return [str(r["run_id"]) for r in rows]

    def task_states(self, run_ids: list[str]) -> Counter:
        rows = self.rows("SELECT step_slug, status FROM pgflow.step_tasks WHERE run_id = ANY(%s::uuid[])", (run_ids,))
        return Counter((r["step_slug"], r["status"]) for r in rows)

    def started(self, run_ids: list[str], step: str = "work") -> int:
        return self.task_states(run_ids)[(step, "started")]

    # -- gates ------------------------------------------------------------------------------------
    def release(self, run_id: str | None = None) -> None:
        """Let ``work`` of one run (or of every run: ``None``) finish."""
        (self.gate / (run_id or "all")).touch()

    # -- workers ----------------------------------------------------------------------------------
    def spawn(self, function_name: str, flow_slug: str, *, wait_registered: bool = True) -> WorkerProc:
        """Start a worker process; by default wait until its worker row exists."""
        worker_id = str(uuid.uuid4())
        env = _cli_env()
        env["PYTHONUNBUFFERED"] = "1"
        env["FENCE_WORKER_ID"] = worker_id
        popen = subprocess.Popen(
            [sys.executable, str(WORKER_SCRIPT), self.conninfo, function_name, flow_slug, str(self.gate)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO),
        )
        proc = WorkerProc(popen, worker_id, function_name, flow_slug)
        self.procs.append(proc)
        if wait_registered:
            def registered() -> bool:
                if proc.exited():
                    raise AssertionError(f"worker exited ({proc.popen.returncode}) before registering\n{proc.describe()}")
                return self.val("SELECT count(*) FROM pgflow.workers WHERE worker_id = %s", (worker_id,)) == 1

            wait_until(registered, f"worker {worker_id} to register", describe=proc.describe)
        return proc

    def ran(self) -> Counter:
        """How often each (run_id, step, task_index) handler ran, over every worker process."""
        return Counter(key for proc in self.procs for key in proc.ran())

    # -- the CLI ----------------------------------------------------------------------------------
    def fence_args(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "pgflow_cli", "fence", *args, "--dsn", self.conninfo]

    def cli(self, *args: str, timeout: float = DEADLINE) -> CliResult:
        """Run ``pgflow fence ARGS --dsn ...`` to completion."""
        proc = subprocess.run(self.fence_args(*args), capture_output=True, text=True, env=_cli_env(),
                              timeout=timeout, cwd=str(REPO))
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    def cli_background(self, *args: str) -> Cli:
        """Start ``pgflow fence ARGS --dsn ...`` and return at once."""
        popen = subprocess.Popen(self.fence_args(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=_cli_env(), cwd=str(REPO), preexec_fn=sigint_as_at_a_terminal)
        cli = Cli(popen)
        self.clis.append(cli)
        return cli

    # -- teardown ---------------------------------------------------------------------------------
    def close(self) -> None:
        self.release()
        for cli in self.clis:
            if cli.popen.poll() is None:
                cli.popen.kill()
                cli.popen.wait(timeout=30)
        for proc in self.procs:
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()

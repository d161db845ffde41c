"""The test run's private PostgreSQL server is stopped and its directory deleted however the run ends:
on SIGTERM or SIGHUP to pytest (alone or as xdist controller) and when an xdist worker crashes.

Each test starts a pytest of its own on one test of tests/support/harness_probe.py, waits until that
test has said where its server lives (the state: server up, test running), ends or crashes it, and
checks that the server's postmaster is gone and its base directory removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pgflow_cli.sandbox import LocalServer
from tests.worker.helpers import wait_until

REPO = Path(__file__).resolve().parent.parent
PROBE = "tests/support/harness_probe.py"
DEADLINE = 120.0


def _postmaster_alive(pid: int) -> bool:
    try:
        return b"postgres" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class InnerRun:
    """A pytest of its own on one probe test, in its own session (the outer run's signals stay out)."""

    def __init__(self, tmp_path: Path, test: str, *options: str) -> None:
        self.probe = tmp_path / "probe.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env["PGFLOW_PROBE_FILE"] = str(self.probe)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options, f"{PROBE}::{test}"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.server: dict | None = None

    def wait_for_the_server(self) -> dict:
        """Wait until the probe test wrote where its server lives (failing at once if the run ended)."""
        def announced() -> bool:
            if self.probe.exists():
                return True
            assert self.proc.poll() is None, f"the inner run ended first:\n{self.proc.communicate()[0]}"
            return False

        wait_until(announced, "the inner run's probe test to start with its server", timeout=DEADLINE)
        self.server = json.loads(self.probe.read_text())
        assert _postmaster_alive(self.server["postmaster"])
        return self.server

    def finish(self) -> tuple[int, str]:
        """Wait for the run to end: its exit status and output."""
        output, _ = self.proc.communicate(timeout=DEADLINE)
        return self.proc.returncode, output

    def clean_up(self) -> None:
        """What a failing test leaves: the inner run ended, its server stopped and deleted."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.server and Path(self.server["base"]).exists():
            LocalServer(Path(self.server["base"]) / "pg").destroy()
            with contextlib.suppress(OSError):
                os.rmdir(self.server["base"])


@pytest.fixture
def inner_runs(tmp_path):
    runs: list[InnerRun] = []

    def start(test: str, *options: str) -> InnerRun:
        runs.append(InnerRun(tmp_path, test, *options))
        return runs[-1]

    yield start
    for run in runs:
        run.clean_up()


def _assert_gone(server: dict, output: str) -> None:
    assert not _postmaster_alive(server["postmaster"]), f"the postmaster still runs\n{output}"
    assert not Path(server["base"]).exists(), f"{server['base']} is still there\n{output}"


@pytest.mark.parametrize(("options", "signum"), [
    (["-p", "no:xdist"], signal.SIGTERM), (["-n", "1"], signal.SIGTERM), (["-p", "no:xdist"], signal.SIGHUP)],
    ids=["alone-SIGTERM", "xdist-controller-SIGTERM", "alone-SIGHUP"])
def test_a_signal_to_pytest_stops_and_deletes_the_server(inner_runs, options, signum):
    run = inner_runs("test_hold_the_server_until_a_signal", *options)
    server = run.wait_for_the_server()
    os.kill(run.proc.pid, signum)
    code, output = run.finish()
    assert code == 128 + signum, output
    assert f"{signal.Signals(signum).name}: ending the run, stopping the test server" in output
    _assert_gone(server, output)


def test_a_crashed_xdist_worker_leaves_the_controller_to_stop_the_server(inner_runs):
    run = inner_runs("test_crash_the_worker", "-n", "1")
    server = run.wait_for_the_server()
    code, output = run.finish()
    assert code == pytest.ExitCode.TESTS_FAILED and "crashed" in output, output
    _assert_gone(server, output)

"""`pgflow status --watch [--interval SECONDS]`, and `--watch SECONDS` as before, without typer's
deprecated optional-value option (is_flag=False, flag_value=), under which `--watch` alone said
"Option '--watch' requires an argument"."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from pgflow_cli.cli.status import WATCH_DEFAULT, watch_interval
from pgflow_cli.errors import ExitCode, UsageError
from tests.status.conftest import validate
from tests.support.cli import _clean_env, run_cli, sigint_as_at_a_terminal


def _two_snapshots_then_ctrl_c(conninfo: str, *watch: str) -> str:
    """Run ``pgflow status --format json`` with the ``watch`` options, read two snapshots (it redraws),
    Ctrl-C it, and return its stderr once it exited 130."""
    command = [sys.executable, "-m", "pgflow_cli", "status", "--dsn", conninfo, *watch, "--format", "json"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_clean_env(),
                          preexec_fn=sigint_as_at_a_terminal) as proc:
        try:
            for _ in range(2):
                line = proc.stdout.readline()
                assert line, f"{watch}: no snapshot; stderr: {proc.stderr.read()}"
                validate(line, "status")
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == ExitCode.INTERRUPTED
            return proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()


@pytest.mark.parametrize("watch", [["--watch"], ["--watch", "--interval", "0.2"], ["--interval", "0.2", "--watch"],
                                   ["--watch", "0.2"]], ids=["alone", "interval", "interval-first", "seconds"])
def test_every_spelling_of_watch_redraws_until_ctrl_c(db, watch):
    assert "stopped watching" in _two_snapshots_then_ctrl_c(db.conninfo, *watch)


def test_the_interval_each_spelling_means():
    assert watch_interval(False, None, None) is None
    assert watch_interval(True, None, None) == WATCH_DEFAULT == 2.0
    assert watch_interval(True, 5.0, None) == watch_interval(True, None, 5.0) == 5.0


@pytest.mark.parametrize(("seconds", "interval", "says"), [
    (5.0, None, "SECONDS 5 without --watch"), (None, 5.0, "--interval 5 without --watch")])
def test_an_interval_without_watch_is_refused(seconds, interval, says):
    with pytest.raises(UsageError, match=says) as raised:
        watch_interval(False, seconds, interval)
    assert raised.value.hint == "to redraw every 5 s: pgflow status --watch --interval 5"


@pytest.mark.parametrize("args", [["--interval", "1"], ["1"], ["--watch", "1", "--interval", "1"]])
def test_misplaced_intervals_are_usage_errors_before_connecting(args):
    result = run_cli("status", "--dsn", "host=/nonexistent-socket-dir", *args)
    assert result.code == ExitCode.USAGE, result.output
    assert "error: " in result.stderr and "Traceback" not in result.output


@pytest.mark.parametrize("args", [["--watch", "0.1"], ["--watch", "--interval", "0.1"], ["--watch=2"]])
def test_too_short_an_interval_or_the_old_equals_form_is_refused_by_the_parser(args):
    result = run_cli("status", "--dsn", "host=/nonexistent-socket-dir", *args)
    assert result.code == ExitCode.USAGE, result.output
    assert "Traceback" not in result.output

"""`pgflow sandbox` with awkward directories and concurrent use."""

from __future__ import annotations

import os
import subprocess
import sys

from pgflow_cli.errors import ExitCode
from tests.breaker.conftest import clean_env, run_cli_env


def test_sandbox_in_a_directory_with_a_space(sandbox_base):
    env = {"PGFLOW_SANDBOX_DIR": os.path.join(sandbox_base, "my sandbox")}
    up = run_cli_env(env, "sandbox", "up")
    assert up.returncode == ExitCode.OK, up.stderr
    audit = run_cli_env(env, "audit", "--sandbox")
    assert audit.returncode == ExitCode.OK, audit.stderr


def test_sandbox_dir_that_cannot_be_created_is_a_usage_error(sandbox_base):
    blocker = os.path.join(sandbox_base, "a-file")
    with open(blocker, "w") as handle:
        handle.write("not a directory\n")
    up = run_cli_env({"PGFLOW_SANDBOX_DIR": os.path.join(blocker, "sb")}, "sandbox", "up")
    assert up.returncode == ExitCode.USAGE, up.stderr
    assert "internal error" not in up.stderr


def test_too_deep_sandbox_dir_hint_names_only_real_options(sandbox_base):
    env = {"PGFLOW_SANDBOX_DIR": os.path.join(sandbox_base, "d" * 90)}
    up = run_cli_env(env, "sandbox", "up")
    assert up.returncode == ExitCode.USAGE, up.stderr
    helps = run_cli_env({}, "sandbox", "up", "--help").stdout
    if "--dir" in up.stderr:
        assert "--dir" in helps


def test_two_concurrent_sandbox_ups_both_succeed(sandbox_base):
    codes = []
    for attempt in range(2):
        env = clean_env({"PGFLOW_SANDBOX_DIR": os.path.join(sandbox_base, f"race{attempt}")})
        procs = [subprocess.Popen([sys.executable, "-m", "pgflow_cli", "sandbox", "up"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        codes.extend(p.communicate(timeout=120) and p.returncode for p in procs)
    assert codes == [0, 0, 0, 0]


def test_reset_without_yes_off_a_terminal_keeps_the_database(sandbox_base):
    """Guard: `reset` and `reset --destroy` without --yes on a pipe refuse with exit 2 and touch nothing."""
    env = {"PGFLOW_SANDBOX_DIR": os.path.join(sandbox_base, "keep")}
    assert run_cli_env(env, "sandbox", "up").returncode == 0
    for extra in ((), ("--destroy",)):
        refused = run_cli_env(env, "sandbox", "reset", *extra)
        assert refused.returncode == ExitCode.USAGE, refused.stderr
        assert "--yes" in refused.stderr
    status = run_cli_env(env, "migrate", "status", "--sandbox", "--format", "json")
    assert status.returncode == 0 and '"pending": []' in status.stdout

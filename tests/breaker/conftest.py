"""Fixtures of the breaker tests: adversarial checks found by a review; each guards a fixed defect or a property that held."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from tests.support.cli import sigint_as_at_a_terminal
from tests.upgrade.conftest import build_pre_upgrade


@pytest.fixture
def pre_upgrade_db(baseline_db):
    """A baseline (0002) database holding runs in every state, built through the released runtime."""
    build_pre_upgrade(baseline_db.conninfo)
    return baseline_db


@pytest.fixture
def sandbox_base():
    """A short, postgres-traversable base directory for private sandboxes; stopped and removed afterwards."""
    base = tempfile.mkdtemp(prefix="pgflow-brk-", dir="/tmp")
    os.chmod(base, 0o755)
    yield base
    # stop every server a test may have left running below base, then remove it
    for root, dirs, _files in os.walk(base):
        if "data" in dirs and os.path.isfile(os.path.join(root, "data", "postmaster.pid")):
            run_cli_env({"PGFLOW_SANDBOX_DIR": root}, "sandbox", "down")
    subprocess.run(["rm", "-rf", base], check=False)


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment ``tests.support.cli.run_cli`` uses: no PG* / DATABASE_URL variables."""
    env = {k: v for k, v in os.environ.items() if not (k.startswith("PG") or k == "DATABASE_URL")}
    env.setdefault("COLUMNS", "200")
    env.update(extra or {})
    return env


def run_cli_env(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pgflow_cli", *args], capture_output=True, text=True,
                          env=clean_env(env), timeout=timeout)


def popen_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``pgflow ARGS`` so that SIGINT reaches Python's handler (not ignored like a shell background job)."""
    return subprocess.Popen([sys.executable, "-m", "pgflow_cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clean_env(env),
                            preexec_fn=sigint_as_at_a_terminal)

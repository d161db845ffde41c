"""The README's quickstart runs as written: in a fresh copy of the repository, every runnable block in
a new shell of its own (`pgflow` is found only after `source .venv/bin/activate`, as for a newcomer
who opens a new terminal after installing), against a private sandbox or a fresh database reached
over TCP with a password (docs/commands/README.md "Runnable blocks")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import runnable
from tests.support.checkout import fresh_copy

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def _new_shell_env(home: Path) -> dict[str, str]:
    """A login's environment: the PATH without this test run's virtual environment (so `pgflow` is not
    there), a home of its own, pip's settings (where packages come from), nothing naming a database."""
    ours = {str(Path(sys.prefix) / "bin"), str(Path(sys.executable).parent)}
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p not in ours)
    env = {"HOME": str(home), "PATH": path, "LANG": "C.UTF-8", "COLUMNS": "100"}
    env.update({k: v for k, v in os.environ.items() if k.startswith(("PIP_", "PYENV"))})
    return env


def test_the_readme_has_the_operator_quickstart_and_a_place_for_developers():
    text = README.read_text(encoding="utf-8")
    found = runnable.blocks(README)
    assert [b.needs for b in found] == ["", "sandbox", "none", "baseline"]
    assert "## Quickstart for operators" in text and "## For application developers" in text
    assert all(b.lines[0] == "source .venv/bin/activate" for b in found[1:])  # a new shell activates first


@pytest.mark.slow
def test_the_readme_quickstart_runs_as_written_in_a_fresh_copy(harness, tmp_path):
    clone = fresh_copy(tmp_path / "pgflow-cli")
    home = tmp_path / "home"
    home.mkdir()
    found = runnable.blocks(README)
    install, rest = found[0], found[1:]
    env = _new_shell_env(home)
    assert subprocess.run(["bash", "-c", "command -v pgflow"], env=env, capture_output=True).returncode != 0
    runnable.check(install, *runnable.run(install, env, clone))
    assert (clone / ".venv" / "bin" / "pgflow").is_file()
    for block in rest:
        with runnable.target(block.needs, harness) as extra:
            results, output = runnable.run(block, {**env, **extra}, clone)
            runnable.check(block, results, output)
            assert "Traceback" not in output and "internal error" not in output, output

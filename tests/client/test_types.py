"""The run client is typed by the flow object's step slugs (checked with mypy on
tests/client/typing/client_typed.py: its ``assert_type`` lines hold, its ``# caught`` lines are errors)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TYPED = Path(__file__).with_name("typing") / "client_typed.py"


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (pip install -e '.[test]')")
def test_results_are_typed_by_the_flows_step_slugs(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "--hide-error-context", "--strict",
                           "--cache-dir", str(tmp_path / "cache"), str(TYPED)],
                          capture_output=True, text=True, timeout=300, cwd=str(REPO))
    lines = TYPED.read_text().splitlines()
    caught = [n for n, line in enumerate(lines, 1) if line.endswith("# caught")]
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    flagged = sorted({int(line.split(":")[1]) for line in errors})
    assert flagged == caught, done.stdout

"""Every shell block of docs/*.md and docs/commands/*.md marked runnable runs as written, each in a new
shell, against what its marker asks for (docs/commands/README.md "Runnable blocks")."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.support import runnable

DOCS = Path(__file__).resolve().parent.parent / "docs"
BLOCKS = [block for path in sorted([*DOCS.glob("*.md"), *DOCS.glob("commands/*.md")])
          for block in runnable.blocks(path)]


def test_the_docs_have_runnable_blocks():
    assert len(BLOCKS) >= 3, "docs/*.md mark their self-contained shell blocks runnable"


@pytest.mark.parametrize("block", BLOCKS, ids=[b.label for b in BLOCKS])
def test_a_runnable_block_runs_as_written(harness, tmp_path, block):
    env = {k: v for k, v in os.environ.items() if not (k.startswith("PG") or k == "DATABASE_URL")}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")  # this install's pgflow
    env["COLUMNS"] = "100"
    with runnable.target(block.needs, harness) as extra:
        results, output = runnable.run(block, {**env, **extra}, tmp_path)
        runnable.check(block, results, output)
        assert "Traceback" not in output and "internal error" not in output, output


def test_a_failing_line_is_reported():
    block = runnable.Block(Path("x.md"), 1, "", ("true", "false", "(exit 3)  # exit 3"))
    results, output = runnable.run(block, dict(os.environ), Path("/tmp"))
    with pytest.raises(AssertionError, match="`false` exited 1, expected 0"):
        runnable.check(block, results, output)
    assert [r.code for r in results] == [0, 1, 3] and block.expected() == [0, 0, 3]

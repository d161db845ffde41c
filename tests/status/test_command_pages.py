"""The `console` examples of docs/commands/status.md and runs.md, run on a fresh database, print what the page shows.

(The shared page test of issue 16 item 7 may cover these too; this keeps the two pages true on their own.)
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.support.cli import run_cli

DOCS = Path(__file__).resolve().parents[2] / "docs" / "commands"


def _examples(page: str) -> list[tuple[list[str], str]]:
    found = []
    for block in re.findall(r"```console\n(.*?)```", (DOCS / page).read_text(), re.S):
        first, _, output = block.partition("\n")
        assert first.startswith("$ pgflow "), first
        found.append((shlex.split(first[len("$ pgflow "):]), output))
    return found


@pytest.mark.parametrize("page", ["status.md", "runs.md"])
def test_console_examples_print_what_the_page_shows(db, page):
    examples = _examples(page)
    assert examples, f"{page} has no console example"
    for args, expected in examples:
        result = run_cli(*args, "--dsn", db.conninfo, env={"COLUMNS": "80"})
        assert result.code == 0, result.output
        assert result.stdout == expected, f"{args}:\n{result.stdout}"

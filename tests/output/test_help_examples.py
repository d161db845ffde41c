"""Issue 29: every command's help ends with examples of that very command (`--help` teaches)."""

from __future__ import annotations

import re

import pytest

from tests.support.cli import command_leaves, run_cli

LEAVES = command_leaves()


@pytest.mark.parametrize("path", sorted(LEAVES), ids=" ".join)
def test_the_help_ends_with_examples_of_the_command(path):
    text = LEAVES[path].help or ""
    assert "Examples:" in text, f"pgflow {' '.join(path)} --help has no Examples section"
    examples = text.rsplit("Examples:", 1)[1]
    lines = [line.strip() for line in examples.splitlines() if line.strip() and line.strip() != "\b"]
    assert lines, "an empty Examples section"
    assert lines and all(line.startswith(f"pgflow {' '.join(path)}") for line in lines), lines


def test_examples_are_shown_one_per_line():
    shown = run_cli("migrate", "status", "--help", env={"COLUMNS": "100"}).stdout
    assert re.search(r"Examples:\n\s+pgflow migrate status\n\s+pgflow migrate status --verbose", shown), shown


@pytest.mark.parametrize("path", sorted(LEAVES), ids=" ".join)
def test_every_example_parses(path):
    """An example with a misspelt option would teach the wrong thing: each one goes through the parser."""
    import shlex

    text = LEAVES[path].help or ""
    for line in text.rsplit("Examples:", 1)[1].splitlines():
        words = shlex.split(line.split(" | ")[0].split(" > ")[0].split(" < ")[0])
        if not words:
            continue
        LEAVES[path].make_context(" ".join(path), words[1 + len(path):])  # raises on a bad option or argument

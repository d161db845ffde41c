"""The fence commands the docs tell operators to run exist with the options they use."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from tests.support.cli import run_cli

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _documented_commands() -> list[list[str]]:
    commands = []
    for name in ("rollout.md", "upgrade.md", "claim-protocol.md", "step-queues.md"):
        for line in (DOCS / name).read_text(encoding="utf-8").splitlines():
            for match in re.finditer(r"pgflow fence (disable|restore|status)([^`#\n]*)", line):
                commands.append(shlex.split(match.group(0).replace("$DATABASE_URL", "x")))
    return commands


def test_every_documented_fence_command_parses():
    commands = _documented_commands()
    assert len(commands) > 10
    helps: dict[str, str] = {}
    for words in commands:
        sub = words[2]
        if sub not in helps:
            result = run_cli("fence", sub, "--help")
            assert result.code == 0
            helps[sub] = result.stdout
        for word in words[3:]:
            if word.startswith("-"):
                assert re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", helps[sub]), f"{' '.join(words)}: {word}"

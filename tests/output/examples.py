"""Run the ```console examples of docs/commands/*.md and compare their output (docs/commands/README.md).

An example block: info string ``console``, first line ``$ pgflow ...``, then the output. An HTML
comment ``<!-- example-db: baseline -->`` before a block picks the database it runs on: ``latest`` (the
default, :func:`tests.output.helpers.seed`), ``baseline`` or ``blocked``
(:func:`~tests.output.helpers.seed_baseline`).
Outputs are compared line by line after :func:`normalise` (what varies between runs) with runs of
spaces collapsed; a line ``...`` matches any number of lines.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from pgflow_cli import __version__
from tests.support.cli import run_cli

PAGES = Path(__file__).resolve().parents[2] / "docs" / "commands"

_BLOCK = re.compile(r"(?:<!-- example-db: (?P<db>\w+) -->\s*\n)?```console\n(?P<body>.*?)```", re.S)


@dataclass
class Example:
    page: str
    database: str
    command: list[str]
    expected: list[str]

    @property
    def label(self) -> str:
        return f"{self.page}: {' '.join(self.command)}"


def examples() -> list[Example]:
    """Every console example of every page (README.md only describes the format)."""
    found = []
    for path in sorted(PAGES.glob("*.md")):
        if path.name == "README.md":
            continue
        for match in _BLOCK.finditer(path.read_text()):
            lines = match.group("body").rstrip("\n").splitlines()
            assert lines and lines[0].startswith("$ pgflow "), f"{path.name}: an example starts with '$ pgflow '"
            found.append(Example(path.name, match.group("db") or "latest", shlex.split(lines[0][2:])[1:], lines[1:]))
    return found


def run(example: Example, conninfo: str) -> tuple[int, str]:
    """Run the example's command on ``conninfo`` (``--dsn`` added; stdout piped, 80 columns)."""
    result = run_cli(*example.command, "--dsn", conninfo, env={"COLUMNS": "80"})
    return result.code, result.stdout


_RULES = [
    (re.compile(r"--dsn (?:'[^']*'|<dsn>|[^\s`']+)"), "--dsn <dsn>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uuid>"),
    (re.compile(r"\b[0-9a-f]{8}\u2026"), "<uuid>\u2026"),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?\b"), "<time>"),
    (re.compile(r"\b[0-9a-f]{64}\b"), "<sha256>"),
    (re.compile(r"\b[0-9a-f]{12}\.\.\."), "<sha256>..."),
    (re.compile(r"\b\d+(\.\d+)? ?ms\b"), "<ms>"),
    (re.compile(r"\b\d+\.\d+ ?s\b"), "<s>"),
    (re.compile(r"(\"[a-z_]*(seconds|_ms|held_ms|duration_ms|attempts)\": )[0-9.]+"), r"\1<n>"),
    (re.compile(r"\b\d+ (s|min|h|d)\b( \d+ (s|min|h))?"), "<age>"),
    (re.compile(r"\bpid \d+"), "pid <pid>"),
    (re.compile(r"\boid \d+"), "oid <oid>"),
    (re.compile(r"(?<![\w.])\d+[dhms]( \d+[hms])?(?!\w)"), "<age>"),
    (re.compile(r"(?<![\d.])\d+\.\d(?![\d.])"), "<s>"),  # a duration column (0.1)
    (re.compile(r"\b\d+(\.\d+)?s\b"), "<s>"),
]


_MARKDOWN_RULE = re.compile(r"^\|(?:[-:]+\|)+$", re.MULTILINE)


def normalise(text: str, conninfo: str, *, collapse: bool = True) -> list[str]:
    """What varies between runs replaced by the placeholders of docs/commands/README.md, spaces collapsed
    (``collapse=False``: kept, for writing a page)."""
    params = conninfo_to_dict(conninfo)
    host, port, dbname, user = (str(params.get(k, "")) for k in ("host", "port", "dbname", "user"))
    text = text.replace(f"{user}@{host}:{port}/{dbname}", "<database>")
    text = text.replace(__version__, "<version>")
    for needle, placeholder in ((host, "<host>"), (dbname, "<dbname>")):
        if needle:
            text = text.replace(needle, placeholder)
    text = re.sub(r'("port": )\d+', r"\1<port>", text)
    text = re.sub(r'("server_version": )"[^"]*"', r'\1"<server>"', text)
    text = re.sub(r'("server_version_num": )\d+', r"\1<server>", text)
    text = re.sub(r"PostgreSQL \d+\.\d+( \([^)]*\))?", "PostgreSQL <server>", text)
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    # a Markdown table's rule row is as wide as its widest cell, which may be a placeholder's value
    # (the version): its width says nothing
    text = _MARKDOWN_RULE.sub(lambda rule: re.sub(r"-+", "---", rule.group(0)), text)
    lines = [" ".join(line.split()) if collapse else line for line in text.splitlines()]
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def matches(expected: list[str], actual: list[str]) -> bool:
    """Line-by-line equality where an expected line ``...`` stands for any number of lines."""
    if not expected:
        return not actual
    if expected[0] == "...":
        return any(matches(expected[1:], actual[i:]) for i in range(len(actual) + 1))
    return bool(actual) and expected[0] == actual[0] and matches(expected[1:], actual[1:])

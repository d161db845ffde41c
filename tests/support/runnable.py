"""Shell blocks of the documentation marked runnable (docs/commands/README.md "Runnable blocks").

A block is marked by an HTML comment on the line before its fence::

    <!-- runnable: sandbox -->
    ```sh
    pgflow sandbox up --seed demo
    pgflow audit --sandbox        # exit 1: findings
    ```

The word after ``runnable:`` says what the block needs: ``sandbox`` (a private, fresh sandbox:
``PGFLOW_SANDBOX_DIR``), ``none``, ``baseline`` or ``newest`` (a fresh database without pgflow, at the
baseline level, at the newest level, named by ``PGFLOW_DATABASE_URL`` and ``DATABASE_URL``, over TCP
with a password in the URL), or nothing (no database). Every line runs in one new shell, in order
(so ``cd``, ``export`` and ``source`` carry over); each must exit 0, or the code its comment states
with ``# exit N``.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

MARKED = re.compile(r"^<!-- runnable(?:: (?P<needs>[a-z]+))? -->\n```(?:sh|shell|bash)\n(?P<body>.*?)^```",
                    re.M | re.S)
EXPECTED = re.compile(r"#.*?\bexit (?P<code>\d+)\b")
NEEDS = ("", "sandbox", "none", "baseline", "newest")


@dataclass(frozen=True)
class Block:
    """One runnable block: where it is, what it needs, its lines and the exit code each must give."""

    path: Path
    line: int
    needs: str
    lines: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.path.name}:{self.line}"

    def expected(self) -> list[int]:
        return [int(m.group("code")) if (m := EXPECTED.search(line)) else 0 for line in self.lines]


def blocks(path: Path) -> list[Block]:
    """The runnable blocks of one Markdown file, in order."""
    text = path.read_text(encoding="utf-8")
    found = []
    for match in MARKED.finditer(text):
        needs = match.group("needs") or ""
        assert needs in NEEDS, f"{path.name}: unknown runnable target {needs!r} (one of {NEEDS})"
        lines = tuple(line for line in match.group("body").splitlines() if line.strip())
        found.append(Block(path, text.count("\n", 0, match.start()) + 1, needs, lines))
    return found


@dataclass(frozen=True)
class LineResult:
    line: str
    code: int


def run(block: Block, env: dict[str, str], cwd: Path, timeout: float = 600) -> tuple[list[LineResult], str]:
    """Run the block's lines in one new ``bash``, each exactly as written, and record each exit code.

    Returns:
        One result per line that ran (a shell that died early has fewer), and the shell's output.
    """
    with tempfile.NamedTemporaryFile("r", suffix=".codes", dir=cwd) as codes:
        script = "".join(f"{line}\nprintf '%s\\n' \"$?\" >> {codes.name}\n" for line in block.lines)
        done = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
        recorded = [int(code) for code in Path(codes.name).read_text().split()]
    return ([LineResult(line, code) for line, code in zip(block.lines, recorded, strict=False)],
            done.stdout + done.stderr)


def check(block: Block, results: list[LineResult], output: str) -> None:
    """Fail naming the first line that did not exit as the block says."""
    assert len(results) == len(block.lines), f"{block.label}: the shell stopped early:\n{output[-4000:]}"
    for result, expected in zip(results, block.expected(), strict=True):
        assert result.code == expected, \
            f"{block.label}: `{result.line}` exited {result.code}, expected {expected}:\n{output[-4000:]}"


@contextmanager
def target(needs: str, harness) -> Iterator[dict[str, str]]:
    """The environment a block's ``needs`` asks for, built for it alone and removed afterwards.

    Args:
        needs: ``""``, ``sandbox``, ``none``, ``baseline`` or ``newest``.
        harness: the test server (tests/support/server.py), for the databases.

    Yields:
        Variables to add to the block's shell environment.
    """
    import os
    import shutil
    import sys

    from pgflow_cli import installer

    if needs == "sandbox":
        base = Path(tempfile.mkdtemp(prefix="pgflow-rb-", dir="/tmp"))  # short, postgres-accessible
        os.chmod(base, 0o755)
        env = {"PGFLOW_SANDBOX_DIR": str(base / "sandbox")}
        try:
            yield env
        finally:
            subprocess.run([sys.executable, "-m", "pgflow_cli", "sandbox", "reset", "--destroy", "--yes"],
                           env={**os.environ, **env}, capture_output=True, timeout=120)
            shutil.rmtree(base, ignore_errors=True)
        return
    if needs not in ("none", "baseline", "newest"):
        yield {}
        return
    from tests.conftest import _install

    template = None if needs == "none" else harness.template(
        "latest" if needs == "newest" else "baseline",
        lambda c: _install(c, None if needs == "newest" else installer.BASELINE_VERSION))
    database = harness.clone(template, f"runnable_{needs}")
    server = harness.server
    url = f"postgresql://{server.config.superuser}:{server.config.password}@127.0.0.1:{server.port}/{database.name}"
    try:
        yield {"PGFLOW_DATABASE_URL": url, "DATABASE_URL": url}
    finally:
        harness.drop(database)

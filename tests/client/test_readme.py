"""The README's "For application developers" section, run as written: its files are written where
its shell block runs, and the block runs in bash on a private sandbox directory."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.cli import run_cli

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## For application developers"

pytestmark = pytest.mark.slow


def section() -> str:
    text = README.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start:end if end != -1 else None]


def files_and_script() -> tuple[dict[str, str], str]:
    """``{file name: content}`` of the section's python blocks (each right after a line naming its file
    in backquotes) and the text of its one bash block."""
    body = section()
    files = {m["name"]: m["code"] for m in re.finditer(
        r"^`(?P<name>[\w.]+\.py)`[^\n]*\n+```python\n(?P<code>.*?)```", body, re.M | re.S)}
    [script] = re.findall(r"```bash\n(.*?)```", body, re.S)
    return files, script


def test_the_section_has_the_files_its_script_uses():
    files, script = files_and_script()
    assert set(files) == {"flows.py", "app.py"}
    assert "pgflow worker flows:greet" in script and "python app.py" in script


def test_the_application_developer_quickstart_runs_as_written():
    files, script = files_and_script()
    work = Path(tempfile.mkdtemp(prefix="pgflow-appdev-", dir="/tmp"))
    os.chmod(work, 0o755)  # the sandbox server may run as the 'postgres' user
    sandbox = {"PGFLOW_SANDBOX_DIR": str(work / "sandbox")}
    try:
        for name, code in files.items():
            (work / name).write_text(code)
        (work / ".venv").symlink_to(sys.prefix)  # "source .venv/bin/activate": this test's environment
        env = {k: v for k, v in os.environ.items()
               if not (k.startswith("PG") or k in ("DATABASE_URL", "VIRTUAL_ENV"))}
        env.update(sandbox, COLUMNS="200")
        # its own process group: a script that stops half way cannot leave its background worker behind
        shell = subprocess.Popen(["bash", "-e", "-c", script], cwd=work, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = shell.communicate(timeout=600)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGKILL)
        done = subprocess.CompletedProcess(shell.args, shell.returncode, stdout, stderr)
        assert done.returncode == 0, done.stdout + done.stderr
        lines = done.stdout.splitlines()
        assert any(re.fullmatch(r"run [0-9a-f-]{36} of flow greetUser: completed \(waited \d+\.\d s\)", line)
                   for line in lines), done.stdout
        assert 'output: {"greeting":"Hello, Ada Lovelace!"}' in lines
        assert re.search(r"^[0-9a-f-]{36} \{'greeting': 'Hello, Grace Hopper!'\}$", done.stdout, re.M), done.stdout
        assert "worker" in done.stderr and "stopped" in done.stderr  # the worker drained and stopped on kill
    finally:
        run_cli("sandbox", "reset", "--destroy", "--yes", env=sandbox)
        shutil.rmtree(work, ignore_errors=True)

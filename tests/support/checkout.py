"""A copy of the repository's files as a clone would have them, for tests that run the project from
somewhere else (the README in a fresh copy, a release frozen on a throwaway tree)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def fresh_copy(into: Path) -> Path:
    """Copy the tracked and new files (nothing ignored: no .venv, no caches) into ``into``, so that
    uncommitted work is what runs. Returns ``into``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return into

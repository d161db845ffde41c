"""Databases at the old levels of the queue stage, built from the frozen fixtures of tests/fixtures/.

An earlier pgflow-cli build (:data:`pgflow_cli.installer.old_levels.OLD_BUILD`) shipped the stage as
migrations 0003-0016; :func:`build_level` runs that build's own SQL (its ``migrate apply --sql``
output) up to a level, and :func:`build_in_progress` leaves one of its phased migrations part way.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import psycopg

from pgflow_cli import installer
from pgflow_cli.sandbox import find_bindir

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
_BLOCK = re.compile(r"^-- ===== (?P<label>.+?) =====$", re.MULTILINE)

IN_PROGRESS = {
    "0003 in progress after prepare": 2,
    "0003 in progress after validate": 2,
    "0009 in progress after prepare": 8,
    "0009 in progress after index": 8,
}
"""Each interrupted phased run of the fixture -> the level it stands on."""


@cache
def _blocks(name: str) -> dict[str, str]:
    text = (FIXTURES / name).read_text(encoding="utf-8")
    starts = list(_BLOCK.finditer(text))
    return {m["label"]: text[m.start():starts[i + 1].start() if i + 1 < len(starts) else len(text)]
            for i, m in enumerate(starts)}


def psql(conninfo: str, script: str) -> None:
    """Run ``script`` with psql, stopping at the first error (raises with psql's stderr)."""
    ran = subprocess.run([str(find_bindir() / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", conninfo, "-f", "-"],
                         input=script, capture_output=True, text=True, timeout=300)
    if ran.returncode != 0:
        raise RuntimeError(f"psql failed: {ran.stderr[-3000:]}")


def level_script(level: int, *, after: int = 0) -> str:
    """The earlier build's migrations ``after + 1`` .. ``level``, one ``BEGIN ... COMMIT`` each."""
    blocks = [text for label, text in _blocks("old_levels.sql").items() if after < int(label[:4]) <= level]
    assert len(blocks) == level - after, f"the fixture has no level {level}"
    return "".join(blocks)


def build_level(conninfo: str, level: int) -> None:
    """PGMQ, then the earlier build's migrations up to ``level`` (1-16), as that build ran them."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        installer.ensure_pgmq(conn)
    psql(conninfo, level_script(level))


def build_in_progress(conninfo: str, label: str) -> None:
    """The level :data:`IN_PROGRESS` names for ``label``, then that interrupted phased run."""
    build_level(conninfo, IN_PROGRESS[label])
    block = next(text for header, text in _blocks("old_levels_in_progress.sql").items() if header.startswith(label))
    psql(conninfo, block)

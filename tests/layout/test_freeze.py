"""sqlfreeze keeps the released migrations' text when the function files they include change."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from pgflow_cli import sqlfiles

REPO = Path(sqlfiles.sql_root()).parent

CHECK = """
from pgflow_cli import sqlfiles, sqlfreeze
bad = [m for m, pinned in sqlfreeze.RELEASED_CHECKSUMS.items() if sqlfiles.checksum(sqlfiles.load(m)) != pinned]
print("BAD" if bad else "PINNED", *bad)
"""


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_freeze_moves_the_released_text_out_of_the_way_of_an_edit(tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "sql", copy / "sql")
    shutil.copytree(REPO / "pgflow_cli", copy / "pgflow_cli", ignore=shutil.ignore_patterns("__pycache__"))
    for command in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "released"]):
        subprocess.run(command, cwd=copy, check=True, capture_output=True)
    sql = copy / "sql"
    # a change to a function 0003 includes, to a part 0002 includes twice, and to a function a
    # baseline recipe reuses line by line
    _edit(sql / "functions/claim/claim_tasks.sql", "BEGIN\n", "BEGIN\n  -- changed for 0005\n")
    _edit(sql / "functions/runtime/parts/lock_and_load_task.sql", "    RETURN;\n", "    RETURN;  -- changed\n")
    _edit(sql / "functions/definitions/add_step.sql", "BEGIN\n", "BEGIN\n  -- changed too\n")
    # the pruning function 0003 installs through the optional file, which itself stays current
    _edit(sql / "functions/maintenance/prune_data_older_than.sql", "BEGIN\n", "BEGIN\n  -- changed\n")
    optional = (sql / "optional/prune.sql").read_text(encoding="utf-8")
    edited = {p: p.read_text(encoding="utf-8") for p in (sql / "functions").rglob("*.sql")}
    recipes = {p: p.read_text(encoding="utf-8") for p in (sql / "released").rglob("*.sql")}  # from earlier edits
    assert "BAD" in _run(copy, sys.executable, "-c", CHECK).stdout

    frozen = _run(copy, sys.executable, "-m", "pgflow_cli.sqlfreeze")
    assert frozen.returncode == 0, frozen.stdout + frozen.stderr

    assert _run(copy, sys.executable, "-c", CHECK).stdout.startswith("PINNED")
    assert {p: p.read_text(encoding="utf-8") for p in (sql / "functions").rglob("*.sql")} == edited
    assert (sql / "optional/prune.sql").read_text(encoding="utf-8") == optional
    written = sorted(str(p.relative_to(sql)) for p in (sql / "released").rglob("*.sql")
                     if recipes.get(p) != p.read_text(encoding="utf-8"))
    assert written == [
        "released/0002/functions/runtime/complete_task.sql",
        "released/0002/functions/runtime/fail_task.sql",
        "released/0003/functions/claim/claim_tasks.sql",
        "released/0003/functions/definitions/add_step.sql",
        "released/0003/optional/prune.sql",
    ]
    # recipes reuse the current lines instead of copying them (except the lines of complete_task and
    # fail_task that moved into the shared progression cores in 0009: written out, under other names;
    # and 0003's claim_tasks, whose classification and claim 0015 merged into one statement, so its
    # released statements are written out; about 210 lines)
    # (complete_task 80: the map-output lines it shares now come from parts/map_step_output.sql)
    longer = {"released/0002/functions/runtime/complete_task.sql": 80, "released/0002/functions/runtime/fail_task.sql": 50,
              "released/0003/functions/claim/claim_tasks.sql": 240}
    assert all(len((sql / w).read_text(encoding="utf-8").splitlines()) < longer.get(w, 40) for w in written)
    again = _run(copy, sys.executable, "-m", "pgflow_cli.sqlfreeze")
    assert again.returncode == 0 and again.stdout == ""

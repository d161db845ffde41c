"""docs/upgrade.md "Rehearse it on the sandbox" works as written on the demo seed.

The SQL block is read from the doc itself, so the runbook cannot drift from what works.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pgflow_cli.errors import ExitCode
from pgflow_cli.sandbox import demo, find_bindir
from tests.support.cli import run_cli

DOC = Path(__file__).resolve().parents[2] / "docs" / "upgrade.md"


def _rehearsal_sql() -> str:
    section = DOC.read_text(encoding="utf-8").split("## Rehearse it on the sandbox", 1)[1]
    return re.search(r"```sql\n(.*?)```", section, re.S).group(1)


def test_the_documented_rehearsal_makes_the_demo_upgradeable(baseline_db):
    demo.seed(baseline_db.conninfo)
    before = run_cli("audit", "--dsn", baseline_db.conninfo, "--format", "json")
    assert before.code == ExitCode.FINDINGS
    assert '"blocking": 9' in before.stdout

    conn = baseline_db.connect()
    conn.execute(_rehearsal_sql())

    audit = run_cli("audit", "--dsn", baseline_db.conninfo)
    assert audit.code == ExitCode.OK, audit.output
    applied = run_cli("migrate", "apply", "--dsn", baseline_db.conninfo)
    assert applied.code == ExitCode.OK, applied.output
    assert conn.execute("SELECT pgflow.protocol_version()").fetchone()[0] == 2
    assert {r[0] for r in conn.execute("SELECT flow_slug FROM pgflow.flows")} == {
        "greetUser", "processOrder", "billing", "legacyImport", "reportDaily", "etlV2"}


def _rehearsal_shell_lines() -> list[str]:
    section = DOC.read_text(encoding="utf-8").split("## Rehearse it on the sandbox", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_the_sandbox_rehearsal_runs_as_written_and_ends_with_no_run_in_flight():
    """Every line of the runbook's shell blocks, in a shell, on a fresh sandbox; psql gets the SQL block."""
    base = tempfile.mkdtemp(prefix="pgflow-rehearsal-", dir="/tmp")  # short, postgres-accessible
    os.chmod(base, 0o755)
    env = {k: v for k, v in os.environ.items() if not (k.startswith("PG") or k == "DATABASE_URL")}
    env.update(PGFLOW_SANDBOX_DIR=os.path.join(base, "sandbox"), COLUMNS="200",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), str(find_bindir()), env.get("PATH", "")]))
    lines = _rehearsal_shell_lines()
    assert lines[-1].startswith("pgflow status --sandbox") and "sandbox worker --until-idle" in lines[-2]
    audits = 0
    try:
        for line in lines:
            stdin = _rehearsal_sql() if line.startswith("psql ") else None
            proc = subprocess.run(["bash", "-c", line], input=stdin, capture_output=True, text=True, env=env,
                                  timeout=400)
            output = proc.stdout + proc.stderr
            if line.startswith("pgflow audit --sandbox"):
                audits += 1
                expected = ExitCode.FINDINGS if audits == 1 else ExitCode.OK
            else:
                expected = ExitCode.FINDINGS if line.startswith("pgflow migrate plan") else ExitCode.OK
            assert proc.returncode == expected, f"{line}\n{output}"
            if line.startswith("psql "):
                assert "ERROR" not in output, output
        assert "no run in flight" in proc.stdout, proc.stdout
        status = subprocess.run(["pgflow", "status", "--sandbox", "--format", "json"], capture_output=True,
                                text=True, env=env, timeout=60)
        document = json.loads(status.stdout)
        assert document["totals"]["runs_in_flight"] == 0 and document["totals"]["stalled_tasks"] == 0
        assert {f["flow_slug"] for f in document["flows"]} >= {"greetUser", "processOrder"}
    finally:
        subprocess.run(["pgflow", "sandbox", "reset", "--destroy", "--yes"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(base, ignore_errors=True)

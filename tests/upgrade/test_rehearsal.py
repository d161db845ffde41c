"""docs/upgrade.md "Rehearse it on the sandbox" works as written on the demo seed.

The SQL block is read from the doc itself, so the runbook cannot drift from what works.
"""

from __future__ import annotations

import re
from pathlib import Path

from pgflow_cli.errors import ExitCode
from pgflow_cli.sandbox import demo
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

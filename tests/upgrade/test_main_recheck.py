"""0003's last transaction holds ACCESS EXCLUSIVE on the task table; the rechecks it runs under
that lock (0003's own and the current audit's blocking rules, installer.steps._current_recheck)
must not read the task table, or workers wait for a full scan (1.1 s on a million task rows,
bench/benchmarks/adoption.py). The plans are checked with EXPLAIN ANALYZE: no scan of
``pgflow.step_tasks`` may run on a healthy database."""

from __future__ import annotations

from typing import Any

from pgflow_cli import installer, sqlfiles


def _task_scans(node: dict[str, Any]) -> list[str]:
    """Plan nodes over pgflow.step_tasks that ran (loops > 0), as ``node type (loops)``."""
    found = []
    if node.get("Relation Name") == "step_tasks" and node.get("Actual Loops", 0) > 0:
        found.append(f"{node['Node Type']} ({node['Actual Loops']} loops)")
    for child in node.get("Plans", []):
        found += _task_scans(child)
    return found


def test_the_current_audit_recheck_reads_no_task_row(pre_upgrade):
    database, _state = pre_upgrade
    conn = database.connect()
    installer.apply(conn, online="always")
    assert conn.execute("SELECT count(*) FROM pgflow.step_tasks").fetchone()[0] > 0
    plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sqlfiles.statement("audit.sql", "findings")).fetchone()[0]
    assert _task_scans(plan[0]["Plan"]) == []

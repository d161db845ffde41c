"""`pgflow audit` options and output formats: --flow, --fail-on, JSON, CSV, --print-sql."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

from pgflow_cli.errors import ExitCode
from pgflow_cli.operations import audit as audit_op
from pgflow_cli.sqlfiles import sql_root
from tests.audit.helpers import audit, cli, cli_json
from tests.support import published
from tests.support.cli import run_cli

FINDING_KEYS = {
    "check_id", "severity", "blocking", "flow_slug", "step_slug", "object_type", "object_name",
    "reasons", "evidence", "message", "fix",
}
FLOW_KEYS = {
    "flow_slug", "queue_mode", "steps", "total_runs", "active_runs", "queued_tasks", "started_tasks",
    "queue_names", "queues_missing", "queues_unreadable", "queue_backlog", "backlog_exact",
    "oldest_message_age_seconds",
    "archive_rows_estimate", "archive_bytes", "shares_queue_with", "findings",
}


def test_json_document_is_versioned_and_stable(published_db):
    result, doc = cli_json(published_db)

    assert result.code == ExitCode.FINDINGS
    assert result.stderr == ""  # no progress chatter in machine formats
    assert set(doc) == {"kind", "version", "tool_version", "database", "filter", "fail_on", "summary",
                        "findings", "flows", "timing"}
    assert (doc["kind"], doc["version"]) == ("pgflow-cli/audit", 1)
    assert doc["filter"] == {"flows": None} and doc["fail_on"] == "warning"
    # the audit's own facts, plus the connection's (issue 16: `database` describes the server connected to)
    assert set(doc["database"]) == {"name", "role", "server_version", "server_version_num", "audited_at",
                                    "pgflow", "pgmq", "notes",
                                    "host", "hostaddr", "port", "dbname", "user", "service", "source"}
    assert doc["database"]["dbname"] == doc["database"]["name"] == published_db.name
    assert set(doc["database"]["pgflow"]) == {"installed_by", "ledger", "queue_identity", "step_queues", "tables",
                                            "recognition"}
    assert set(doc["database"]["pgmq"]) == {"version", "version_source", "message_headers", "queue_tables",
                                            "unreadable_tables"}
    assert set(doc["summary"]) == {"errors", "warnings", "info", "blocking", "flows", "flows_with_findings",
                                   "by_check", "exit_code", "next", "blocking_elsewhere"}
    assert set(doc["summary"]["by_check"]) == set(audit_op.CHECKS)
    assert (doc["summary"]["errors"], doc["summary"]["warnings"], doc["summary"]["info"]) == (17, 2, 5)  # 3 flow_queue_missing block
    assert doc["summary"]["blocking"] == 16 and doc["summary"]["exit_code"] == 1
    assert all(set(f) == FINDING_KEYS for f in doc["findings"])
    assert all(set(f) == FLOW_KEYS for f in doc["flows"])
    assert {(f["check_id"], f["flow_slug"], f["step_slug"], f["object_name"], tuple(f["reasons"]))
            for f in doc["findings"]} == published.EXPECTED_FINDINGS
    assert doc["timing"]["statements"] == 3


def test_flow_filter_keeps_case_groups_whole(published_db):
    result, doc = cli_json(published_db, "--flow", "myflow")

    assert result.code == ExitCode.FINDINGS
    assert doc["filter"] == {"flows": ["myflow"]}
    assert sorted((f["check_id"], f["object_name"]) for f in doc["findings"]) == [
        ("flow_slug_case_conflict", "MyFlow"),
        ("flow_slug_case_conflict", "myflow"),
        ("queue_alias_conflict", "MyFlow"),
        ("queue_alias_conflict", "myflow"),
        ("queue_meta_spelling", "MyFlow"),
    ]
    assert sorted(f["flow_slug"] for f in doc["flows"]) == ["MyFlow", "myflow"]


def test_flow_filter_is_repeatable_and_drops_queue_only_findings(published_db):
    report = audit(published_db, ["orders", "greetUser"])
    assert sorted((f.check_id, f.object_name) for f in report.findings) == [
        ("queue_meta_spelling", "greetUser"),
        ("step_slug_rejected", "__all__"),
        ("step_slug_rejected", "_prepare"),
        ("step_slug_rejected", "pack__items"),
        ("step_slug_rejected", "ship_"),
    ]
    assert [i.flow_slug for i in report.flows] == ["greetUser", "orders"]
    assert report.summary.flows == 2 and report.summary.blocking == 4


def test_unknown_flow_in_filter_is_exit_6_with_suggestions(published_db):
    result = cli(published_db, "--flow", "MYFLOW")
    assert result.code == ExitCode.CONFLICT
    assert "flow not found: 'MYFLOW'" in result.stderr
    assert "did you mean 'MyFlow' or 'myflow'?" in result.stderr
    assert "Traceback" not in result.output


def test_fail_on_thresholds(published_db):
    # shipping has one warning (its queue is listed as 'Shipping'); greetUser only the info that
    # its queue is listed in camelCase, exactly as the flow is spelled; reindex nothing
    assert cli(published_db, "--flow", "shipping").code == ExitCode.FINDINGS
    assert cli(published_db, "--flow", "shipping", "--fail-on", "error").code == ExitCode.OK
    assert cli(published_db, "--flow", "greetUser").code == ExitCode.OK
    assert cli(published_db, "--flow", published.LONG_FLOW, "--format", "csv").code == ExitCode.OK  # info never fails
    assert cli(published_db, "--fail-on", "never", "--format", "csv").code == ExitCode.OK
    assert cli(published_db, "--fail-on", "error", "--format", "csv").code == ExitCode.FINDINGS
    assert cli(published_db, "--fail-on", "sometimes").code == ExitCode.USAGE


def test_fail_on_in_process(published_db):
    report = audit(published_db)
    assert report.exit_code("never") == 0
    assert report.exit_code("error") == 1 and report.exit_code("warning") == 1
    only_info = audit(published_db, [published.LONG_FLOW])
    assert [f.severity for f in only_info.findings] == ["info"]
    assert only_info.exit_code("warning") == 0 and only_info.exit_code("error") == 0


def test_csv_has_one_row_per_finding(published_db):
    result = cli(published_db, "--format", "csv")
    assert result.code == ExitCode.FINDINGS
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == len(published.EXPECTED_FINDINGS)
    assert list(rows[0]) == ["check_id", "severity", "blocking", "flow_slug", "step_slug", "object_type",
                             "object_name", "reasons", "evidence", "message", "fix"]
    allbad = next(r for r in rows if r["object_name"] == "__all__")
    assert allbad["reasons"] == "leading_underscore;trailing_underscore;double_underscore"
    assert allbad["blocking"] == "true" and allbad["step_slug"] == "__all__"
    assert json.loads(allbad["evidence"])["suggested_slug"] == "all"


def test_print_sql_matches_the_checked_in_psql_file():
    result = run_cli("audit", "--print-sql")
    assert result.code == ExitCode.OK
    checked_in = (sql_root() / audit_op.DIST_SQL).read_text(encoding="utf-8")
    assert result.stdout == audit_op.psql_script()
    assert checked_in == audit_op.psql_script(), (
        "sql/dist/pgflow_audit.sql is stale: regenerate it with `pgflow audit --print-sql > sql/dist/pgflow_audit.sql`"
    )


def test_psql_file_is_self_contained():
    text = audit_op.psql_script()
    assert "--@include" not in text
    assert "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;" in text
    assert text.rstrip().endswith("ROLLBACK;")
    for fragment in ("fragments/slug_violations.sql", "fragments/step_queue_names.sql"):
        body = (sql_root() / fragment).read_text(encoding="utf-8")
        assert body.rstrip("\n") in text  # the rules are included, not re-implemented


def test_check_table_matches_the_sql():
    """Every check id in the SQL is documented in CHECKS and docs/audit.md, with the same blocking flag."""
    findings_sql = (sql_root() / "audit" / "findings.sql").read_text(encoding="utf-8")
    docs = (Path(__file__).resolve().parents[2] / "docs" / "audit.md").read_text(encoding="utf-8")
    for check in audit_op.CHECKS.values():
        blocking = "true" if check.blocking else "false"
        severity = f"'{check.severity}'"
        if check.lower_severities:  # CASE WHEN ... THEN 'info' ELSE 'warning' END
            severity = r"CASE WHEN [^\n]*?" + "".join(f"'{s}'[^\\n]*?" for s in check.lower_severities) + f"'{check.severity}' END"
        literal = re.compile(rf"SELECT '{check.check_id}', {severity}, {blocking},")
        first = f"SELECT '{check.check_id}' AS check_id, '{check.severity}' AS severity, {blocking} AS blocking,"
        in_sql = bool(literal.search(findings_sql) or first in findings_sql)
        assert in_sql is check.in_sql, check.check_id
        assert f"`{check.check_id}`" in docs, check.check_id

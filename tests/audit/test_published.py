"""The audit on a database built from the published @pgflow/core release (a schema nobody here wrote)."""

from __future__ import annotations

import subprocess
import time

from pgflow_cli.errors import ExitCode
from pgflow_cli.operations.audit import CHECKS, DIST_SQL
from pgflow_cli.sqlfiles import sql_root
from tests.audit.helpers import audit, cli, keys
from tests.support import published


def test_exact_findings_on_the_published_release(published_db):
    report = audit(published_db)

    assert keys(report) == published.EXPECTED_FINDINGS
    assert len(report.findings) == len(published.EXPECTED_FINDINGS)  # no duplicates either
    for finding in report.findings:
        check = CHECKS[finding.check_id]
        assert finding.severity in check.severities and finding.blocking == check.blocking, finding.check_id
        assert finding.message and finding.fix
    spelling = {f.object_name: f.severity for f in report.findings if f.check_id == "queue_meta_spelling"}
    assert spelling == {"greetUser": "info", "MyFlow": "info", "Shipping": "warning"}


def test_evidence_names_groups_and_suggestions(published_db):
    report = audit(published_db)
    by_key = {(f.check_id, f.object_name): f for f in report.findings}

    case = by_key["flow_slug_case_conflict", "myflow"]
    assert case.evidence["group"] == ["MyFlow", "myflow"]
    assert case.evidence["normalized"] == "myflow"
    assert '"MyFlow"' in case.message

    alias = by_key["queue_alias_conflict", "MyFlow"]
    assert alias.evidence["group"] == ["MyFlow", "myflow"]
    assert alias.evidence["queue_table"] == "q_myflow"
    assert sorted(alias.evidence["related_flows"]) == ["MyFlow", "myflow"]

    assert by_key["flow_slug_rejected", "report__daily_"].evidence["suggested_slug"] == "report_daily"
    assert by_key["step_slug_rejected", "__all__"].evidence["suggested_slug"] == "all"
    assert by_key["step_slug_rejected", "__all__"].evidence["step_index"] == 4

    spelled = by_key["queue_meta_spelling", "Shipping"]
    assert spelled.flow_slug == "shipping"
    assert "pgmq.drop_queue" in spelled.fix and "'Shipping'" in spelled.fix

    collision = by_key["step_queue_collision", "billing__charge"]
    assert collision.evidence["generated_name"] == "billing__charge"
    assert collision.evidence["name_kind"] == "readable"

    unavailable = by_key["step_queues_unavailable", published.LONG_FLOW]
    assert unavailable.evidence["steps"] == [
        {"step_slug": "count", "step_index": 0, "readable_length": 52, "index_length": 48}
    ]

    wide = by_key["queue_name_too_long", published.WIDE_QUEUE]
    assert wide.evidence["characters"] == 31 and wide.evidence["table_name_bytes"] == 64


def test_flow_impact_on_the_published_release(published_db):
    report = audit(published_db)
    flows = {impact.flow_slug: impact for impact in report.flows}

    assert set(flows) == {
        "reindex", "greetUser", "_legacy_import", "report__daily_", "orders", "MyFlow", "myflow", "ingest",
        "cleanup", "audit_log", "shipping", "billing", published.LONG_FLOW, published.TOO_LONG_FLOW,
    }
    greet = flows["greetUser"]
    assert (greet.steps, greet.total_runs, greet.active_runs) == (2, 2, 2)
    assert (greet.queued_tasks, greet.started_tasks) == (1, 1)
    assert greet.queue_names == ("greetuser",)
    assert greet.queue_backlog == 2  # one queued and one claimed message; the completed one is archived
    assert greet.oldest_message_age_seconds is not None and greet.oldest_message_age_seconds >= 0
    assert greet.archive_bytes and greet.archive_bytes > 0

    assert flows["MyFlow"].shares_queue_with == ("myflow",)
    assert flows["myflow"].shares_queue_with == ("MyFlow",)
    assert flows["myflow"].queue_backlog == 1  # the shared table holds MyFlow's message

    cleanup = flows["cleanup"]
    assert cleanup.queues_missing == 1 and cleanup.queue_backlog is None and cleanup.archive_bytes is None
    audit_log = flows["audit_log"]
    assert audit_log.queues_missing == 1 and audit_log.archive_bytes  # the archive is still there

    # definitions without runs are reported like the others
    assert flows["ingest"].total_runs == 0 and flows["ingest"].findings == 2
    assert flows["reindex"].findings == 0


def test_schema_info_of_the_published_release(published_db):
    schema = audit(published_db).schema
    assert schema.installed_by == "upstream" and not schema.ledger
    assert (schema.pgmq_version, schema.pgmq_version_source) == ("1.13.0", "extension")
    assert schema.pgmq_message_headers
    assert not schema.queue_identity and not schema.step_queues
    assert {"flows", "steps", "deps", "runs", "step_states", "step_tasks", "workers"} <= set(schema.pgflow_tables)
    assert "opt_start_delay" in schema.pgflow_tables["steps"]
    assert any("pre-upgrade schema" in note for note in schema.notes)
    assert schema.recognition["status"] == "upstream"
    assert schema.recognition["releases"] == ["0.8.0", "0.8.1", "0.9.0", "0.9.1"]
    assert schema.notes[0].startswith("installed by pgflow 0.8.0/0.8.1/0.9.0/0.9.1 (recognised from the catalog)")


def test_cli_table_report(published_db):
    result = cli(published_db)

    assert result.code == ExitCode.FINDINGS, result.output
    out = result.stdout
    assert "pgflow schema installed by pgflow 0.8.0/0.8.1/0.9.0/0.9.1 (recognised from the catalog)" in out
    assert "flow MyFlow" in out and "[blocks the upgrade]" in out
    assert "queues no flow owns" in out and "adhoc_jobs" in out
    assert "flow(s) without findings: reindex" in out
    assert "next: fix the 16 blocking finding(s)" in out
    assert "runs: 2 active of 2" in out  # greetUser's impact line
    assert "auditing " in result.stderr and "read-only" in result.stderr  # progress only on stderr
    assert "auditing" not in out
    assert "Traceback" not in result.output


def test_psql_file_runs_without_python(published_db):
    script = sql_root() / DIST_SQL
    proc = subprocess.run(
        ["psql", "-X", "-d", published_db.conninfo, "-f", str(script)],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "BEGIN" in proc.stdout and proc.stdout.rstrip().endswith("ROLLBACK")
    for check_id in {key[0] for key in published.EXPECTED_FINDINGS}:
        assert check_id in proc.stdout
    assert "(24 rows)" in proc.stdout  # the findings
    assert "(14 rows)" in proc.stdout  # one impact row per flow
    assert "ERROR" not in proc.stderr


def test_audit_is_fast_and_set_based(published_db):
    audit(published_db)  # warm the catalog caches of a new backend
    started = time.monotonic()
    report = audit(published_db)
    elapsed = time.monotonic() - started
    assert report.statements == 3
    assert elapsed < 2.0, f"audit took {elapsed:.2f}s"

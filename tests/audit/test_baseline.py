"""The audit on pgflow-cli's own schema: the baseline (0001+0002), a clean database, and the
queue-identity columns that a later migration adds (one static query must serve every version)."""

from __future__ import annotations

from pgflow_cli.db import without_password
from pgflow_cli.errors import ExitCode
from tests.audit.helpers import audit, cli, cli_json, define_flow, insert_task, keys


def test_exact_findings_on_the_baseline_schema(baseline_db):
    conn = baseline_db.connect()
    define_flow(conn, "clean_flow", ["first", "second"])
    define_flow(conn, "_hidden", ["work"])
    define_flow(conn, "Reports", ["render"])
    define_flow(conn, "reports", ["render"])
    define_flow(conn, "etl", ["extract", "Extract"])
    conn.execute("SELECT pgmq.create('side_queue')")
    # the queue was dropped and re-created at some point: old tasks kept their message ids
    insert_task(conn, "etl", "extract", 5)
    insert_task(conn, "etl", "extract", 5)
    insert_task(conn, "etl", "extract", 6)

    report = audit(baseline_db)

    assert keys(report) == {
        ("flow_slug_rejected", "_hidden", None, "_hidden", ("leading_underscore",)),
        ("flow_slug_case_conflict", "Reports", None, "Reports", ("case_only_duplicate",)),
        ("flow_slug_case_conflict", "reports", None, "reports", ("case_only_duplicate",)),
        ("queue_alias_conflict", "Reports", None, "Reports", ("same_physical_table",)),
        ("queue_alias_conflict", "reports", None, "reports", ("same_physical_table",)),
        ("queue_meta_spelling", "Reports", None, "Reports", ("not_lowercase",)),
        ("step_slug_case_conflict", "etl", "Extract", "Extract", ("case_only_duplicate",)),
        ("step_slug_case_conflict", "etl", "extract", "extract", ("case_only_duplicate",)),
        ("task_message_id_duplicate", "etl", None, "etl", ("duplicate_message_id",)),
        ("queue_unowned", None, None, "side_queue", ("no_owning_flow",)),
    }
    duplicate = next(f for f in report.findings if f.check_id == "task_message_id_duplicate")
    assert duplicate.blocking and duplicate.severity == "error"
    assert duplicate.evidence["duplicated_message_ids"] == 1
    assert duplicate.evidence["tasks"] == 2
    assert duplicate.evidence["sample_message_ids"] == [5]

    schema = report.schema
    assert schema.ledger and schema.installed_by == "pgflow-cli"
    assert schema.pgmq_version_source in ("schema comment", "extension")
    assert schema.pgmq_version


def test_clean_database_exits_zero_and_points_to_migrate_plan(baseline_db):
    conn = baseline_db.connect()
    define_flow(conn, "orders", ["validate", "ship"])
    define_flow(conn, "process_payment", ["charge"])

    result = cli(baseline_db)
    assert result.code == ExitCode.OK, result.output
    # the hint repeats the --dsn the audit was given, so it works when pasted (issue 16 item 2)
    assert f"nothing to fix: run `pgflow migrate plan --dsn '{without_password(baseline_db.conninfo)}'`" \
        in result.stdout
    assert "2 flow(s) without findings" in result.stdout

    result, document = cli_json(baseline_db)
    assert result.code == ExitCode.OK
    assert document["findings"] == []
    assert document["summary"]["exit_code"] == 0
    assert document["summary"]["next"] == "nothing to fix: run `pgflow migrate plan`"


def test_empty_pgflow_schema_is_clean(baseline_db):
    report = audit(baseline_db)
    assert report.findings == [] and report.flows == []
    assert report.exit_code("warning") == 0


def test_one_query_text_serves_the_queue_identity_schema(baseline_db):
    """Columns added by the queue-identity and step-queue migrations are read when present."""
    conn = baseline_db.connect()
    define_flow(conn, "orders", ["ship"])
    define_flow(conn, "media", ["resize", "upload"])
    insert_task(conn, "orders", "ship", 9)
    insert_task(conn, "orders", "ship", 9)  # duplicates are the schema's business once queue_name exists
    conn.execute("ALTER TABLE pgflow.flows ADD COLUMN queue_mode text NOT NULL DEFAULT 'flow'")
    conn.execute("ALTER TABLE pgflow.steps ADD COLUMN queue_name text")
    conn.execute("ALTER TABLE pgflow.step_tasks ADD COLUMN queue_name text")
    conn.execute("UPDATE pgflow.steps SET queue_name = lower(flow_slug)")
    conn.execute("UPDATE pgflow.step_tasks SET queue_name = lower(flow_slug)")
    # media becomes a step-queued flow: private queues, no default queue; one private queue is gone
    conn.execute("UPDATE pgflow.flows SET queue_mode = 'step' WHERE flow_slug = 'media'")
    conn.execute("UPDATE pgflow.steps SET queue_name = 'media__' || step_slug WHERE flow_slug = 'media'")
    conn.execute("SELECT pgmq.drop_queue('media')")
    conn.execute("SELECT pgmq.create('media__resize')")
    # an existing queue with the name orders' private step queue would get
    conn.execute("SELECT pgmq.create('orders__ship')")

    report = audit(baseline_db)

    assert keys(report) == {
        ("flow_queue_missing", "media", None, "media__upload",
         ("meta_row_missing", "queue_table_missing", "archive_table_missing")),
        ("step_queue_collision", "orders", "ship", "orders__ship", ("generated_step_queue_name",)),
    }
    assert report.schema.queue_identity and report.schema.step_queues
    media = next(i for i in report.flows if i.flow_slug == "media")
    assert media.queue_mode == "step"
    assert media.queue_names == ("media__resize", "media__upload")
    assert media.queues_missing == 1


def test_audit_runs_on_the_latest_schema(db):
    """Whatever migrations exist, the audit's static SQL keeps working on the newest schema."""
    conn = db.connect()
    define_flow(conn, "orders", ["validate", "ship"])
    report = audit(db)
    assert [f.check_id for f in report.findings if f.flow_slug == "orders"] == []
    assert [i.flow_slug for i in report.flows] == ["orders"]

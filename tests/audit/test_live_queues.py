"""The audit on real queue states: a healthy upgraded database is clean, and every queue whose tables
are not where the upgrade and the workers look is found and blocks (docs/audit.md)."""

from __future__ import annotations

import psycopg
import pytest

from pgflow_cli import installer
from pgflow_cli.errors import ExitCode
from tests.audit.helpers import audit, cli_json, define_flow
from tests.support import server
from tests.support.cli import run_cli


def test_a_camel_case_flow_created_after_the_upgrade_is_clean(db):
    conn = db.connect()
    define_flow(conn, "newOrders", ["validate", "ship"])  # the upgraded create_flow: queue "neworders"
    assert conn.execute("SELECT queue_name FROM pgmq.meta").fetchall() == [("neworders",)]
    report = audit(db)
    assert [(f.check_id, f.severity) for f in report.findings] == []
    result, doc = cli_json(db)
    assert result.code == ExitCode.OK, result.stdout


def _flow_with_a_queued_task(conn, flow_slug: str) -> None:
    define_flow(conn, flow_slug, ["load"])
    conn.execute("SELECT pgflow.start_flow(%s, '{}'::jsonb)", (flow_slug,))


def _blocking(report):
    return [(f.check_id, f.object_name, f.reasons) for f in report.findings if f.blocking]


def _refused_and_unchanged(database):
    apply = run_cli("migrate", "apply", "--dsn", database.conninfo)
    assert apply.code == ExitCode.FINDINGS, apply.output
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        versions = [s.version for s in installer.make_plan(conn).statuses if s.state == "applied"]
    assert max(versions) == installer.BASELINE_VERSION


@pytest.mark.parametrize(
    ("table", "reasons", "what_happens"),
    [
        ("a_orders", ("archive_table_missing",), "completing or failing a task must archive"),
        ("q_orders", ("queue_table_missing",), "starting a run of this flow fails"),
    ],
    ids=["archive-table", "queue-table"],
)
def test_a_flow_queue_without_a_table_blocks_and_says_what_happens(baseline_db, table, reasons, what_happens):
    conn = baseline_db.connect()
    _flow_with_a_queued_task(conn, "orders")
    conn.execute(f"DROP TABLE pgmq.{table}")
    report = audit(baseline_db)
    assert _blocking(report) == [("flow_queue_missing", "orders", reasons)]
    [finding] = [f for f in report.findings if f.check_id == "flow_queue_missing"]
    assert what_happens in finding.message
    assert finding.evidence["queued_tasks"] == 1
    _refused_and_unchanged(baseline_db)


def test_a_queue_with_tables_but_no_meta_row_is_a_warning_only(baseline_db):
    conn = baseline_db.connect()
    _flow_with_a_queued_task(conn, "orders")
    conn.execute("DELETE FROM pgmq.meta WHERE queue_name = 'orders'")
    report = audit(baseline_db)
    assert _blocking(report) == []
    assert [(f.check_id, f.severity) for f in report.findings] == [("flow_queue_meta_missing", "warning")]


@pytest.fixture
def turkish_db(harness):
    """A pre-upgrade database whose default collation is ICU tr-TR (lower('I') = 'ı')."""
    name = "t_icu_tr_tr_live_queues"
    harness.admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    harness.admin.execute(f"CREATE DATABASE \"{name}\" LOCALE_PROVIDER icu ICU_LOCALE 'tr-TR' TEMPLATE template0")
    database = server.TestDatabase(name, harness.server)
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        installer.install(conn, target=installer.BASELINE_VERSION)
    yield database
    harness.drop(database)


def test_a_queue_pgmq_lowercased_with_the_turkish_collation_blocks_the_upgrade(turkish_db):
    conn = turkish_db.connect()
    assert conn.execute("SELECT lower('I')").fetchone()[0] == "ı"  # the collation really is tr-TR
    _flow_with_a_queued_task(conn, "Import")
    tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'pgmq' "
                                         "AND tablename LIKE '%mport' ORDER BY 1")]
    assert tables == ["a_ımport", "q_ımport"]  # where PGMQ really put the messages

    report = audit(turkish_db)
    assert _blocking(report) == [("flow_queue_table_elsewhere", "import",
                                  ("routed_queue_table_elsewhere", "queue_table_missing", "archive_table_missing"))]
    [finding] = [f for f in report.findings if f.blocking]
    assert finding.evidence["legacy_queue_table"] == "q_ımport"
    assert finding.evidence["routed_queue_table"] == "q_import"
    assert finding.evidence["queued_tasks"] == 1
    assert "tr-TR" in finding.message and "can never be read" in finding.message
    # the ı queue is explained by this finding, not reported as a stranger's queue
    assert [f.check_id for f in report.findings if f.check_id == "queue_unowned"] == []
    _refused_and_unchanged(turkish_db)


def test_the_turkish_database_upgrades_once_the_flow_is_drained_and_its_queue_created(turkish_db):
    conn = turkish_db.connect()
    _flow_with_a_queued_task(conn, "Import")
    # drain it with the released runtime (protocol 1 reads the flow's own spelling, which reaches q_ımport)
    [(msg_id,)] = conn.execute("SELECT msg_id FROM pgmq.read('Import', 30, 10)").fetchall()
    [task] = conn.execute("SELECT run_id, step_slug, task_index FROM pgflow.step_tasks WHERE message_id = %s",
                          (msg_id,)).fetchall()
    conn.execute("UPDATE pgflow.step_tasks SET status = 'started', started_at = now(), attempts_count = 1 "
                 "WHERE message_id = %s", (msg_id,))
    conn.execute("SELECT pgflow.complete_task(%s, %s, %s, '1'::jsonb)", task)
    assert conn.execute("SELECT status FROM pgflow.runs").fetchone()[0] == "completed"
    [still] = [f for f in audit(turkish_db).findings if f.blocking]  # drained, but "import" has no tables yet
    assert (still.check_id, still.evidence["queued_tasks"], still.evidence["started_tasks"]) == (
        "flow_queue_table_elsewhere", 0, 0)

    conn.execute("SELECT pgmq.create('import')")
    # the new queue's message ids would repeat the finished task's: still blocked, the fix says how far to skip
    [ids] = [f for f in audit(turkish_db).findings if f.blocking]
    assert (ids.evidence["max_task_message_id"], ids.evidence["routed_next_message_id"]) == (1, 1)
    fix = "SELECT pg_catalog.setval(pg_catalog.pg_get_serial_sequence('pgmq.q_import', 'msg_id'), 1)"
    assert fix in ids.fix
    conn.execute(fix)
    assert _blocking(audit(turkish_db)) == []
    apply = run_cli("migrate", "apply", "--dsn", turkish_db.conninfo)
    assert apply.code == ExitCode.OK, apply.output
    run_id = conn.execute("SELECT run_id FROM pgflow.start_flow('Import', '{}'::jsonb)").fetchone()[0]
    assert conn.execute("SELECT queue_name FROM pgflow.step_tasks WHERE run_id = %s", (run_id,)).fetchone()[0] == "import"
    assert conn.execute("SELECT count(*) FROM pgmq.q_import").fetchone()[0] == 1


def test_the_upgrade_rechecks_the_current_rules_under_its_locks(turkish_db):
    """0003's recheck is the current audit's blocking rules (regenerated from sql/audit/findings.sql
    while 0003 is unreleased), run under its locks: even a caller that skips the preflight (the
    library, the sandbox) never commits tasks routed to a queue without a table."""
    conn = turkish_db.connect()
    _flow_with_a_queued_task(conn, "Import")
    with pytest.raises(psycopg.Error) as refused:
        installer.apply(conn)
    assert refused.value.sqlstate == "PF005"
    assert "flow_queue_table_elsewhere import" in refused.value.diag.message_detail
    assert max(s.version for s in installer.make_plan(conn).statuses if s.state == "applied") == 2
    assert conn.execute("SELECT to_regclass('pgflow.step_tasks') IS NOT NULL AND NOT EXISTS ("
                        "SELECT 1 FROM pg_attribute WHERE attrelid = 'pgflow.step_tasks'::regclass "
                        "AND attname = 'queue_name')").fetchone()[0]  # no task was pointed anywhere

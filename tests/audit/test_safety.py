"""The audit is harmless and needs little: read-only, no objects, SELECT/USAGE only; and bad input
gives a clear message with the documented exit code, never a traceback."""

from __future__ import annotations

import json
import time

from psycopg.conninfo import make_conninfo

from pgflow_cli import sqlfiles
from pgflow_cli.errors import ExitCode
from pgflow_cli.operations.audit import AUDIT_SQL
from pgflow_cli.sandbox import free_port
from tests.audit.helpers import cli, cli_json
from tests.support.cli import run_cli

CATALOG_COUNTS = """
SELECT (SELECT count(*) FROM pg_class) AS classes,
       (SELECT count(*) FROM pg_proc) AS procs,
       (SELECT count(*) FROM pg_type) AS types,
       (SELECT count(*) FROM pg_namespace) AS namespaces,
       (SELECT count(*) FROM pg_attribute) AS attributes,
       (SELECT count(*) FROM pg_depend) AS depends
"""
TABLE_WRITES = """
SELECT relid::regclass::text, n_tup_ins, n_tup_upd, n_tup_del, n_tup_hot_upd, n_live_tup, n_dead_tup
FROM pg_stat_user_tables ORDER BY 1
"""
TABLE_READS = "SELECT coalesce(sum(seq_scan + coalesce(idx_scan, 0)), 0) FROM pg_stat_user_tables"


def _role_dsn(database, role: str) -> str:
    return make_conninfo(database.conninfo, user=role)


def test_a_role_with_only_select_and_usage_can_audit(published_db, harness):
    role = f"auditor_{published_db.name}"[:60]
    conn = published_db.connect()
    conn.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        conn.execute(f'GRANT USAGE ON SCHEMA pgflow, pgmq TO "{role}"')
        conn.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA pgflow, pgmq TO "{role}"')
        as_owner, owner_doc = cli_json(published_db)
        result = run_cli("audit", "--dsn", _role_dsn(published_db, role), "--format", "json")
        assert result.code == ExitCode.FINDINGS, result.stderr
        doc = json.loads(result.stdout)
        assert doc["database"]["role"] == role
        assert doc["findings"] == owner_doc["findings"]
        impacts = {f["flow_slug"]: f for f in doc["flows"]}
        assert impacts["greetUser"]["queue_backlog"] == 2  # queue tables read through query_to_xml

        # without SELECT on a pgflow table: exit 3 and the GRANT to run
        conn.execute(f'REVOKE SELECT ON pgflow.runs FROM "{role}"')
        denied = run_cli("audit", "--dsn", _role_dsn(published_db, role))
        assert denied.code == ExitCode.CONNECTION
        assert "may not read what the audit needs: pgflow.runs" in denied.stderr
        assert "GRANT SELECT ON ALL TABLES IN SCHEMA pgflow, pgmq" in denied.stderr
        assert "Traceback" not in denied.output

        # a queue table it may not read: backlog unknown, still no error
        conn.execute(f'GRANT SELECT ON pgflow.runs TO "{role}"')
        conn.execute(f'REVOKE SELECT ON pgmq.q_greetuser FROM "{role}"')
        partial = run_cli("audit", "--dsn", _role_dsn(published_db, role), "--format", "json")
        assert partial.code == ExitCode.FINDINGS, partial.stderr
        greet = next(f for f in json.loads(partial.stdout)["flows"] if f["flow_slug"] == "greetUser")
        assert greet["queue_backlog"] is None and greet["queues_unreadable"] == 1
    finally:
        conn.execute(f'DROP OWNED BY "{role}"')
        conn.execute(f'DROP ROLE "{role}"')


def test_the_audit_changes_no_catalog_and_no_table_statistics(published_db):
    observer = published_db.connect()
    catalog_before = observer.execute(CATALOG_COUNTS).fetchone()
    writes_before = observer.execute(TABLE_WRITES).fetchall()
    reads_before = observer.execute(TABLE_READS).fetchone()[0]

    result = cli(published_db, "--format", "json")
    assert result.code == ExitCode.FINDINGS

    # wait until the audit's own reads show up in the statistics, so the comparison is not vacuous
    deadline = time.monotonic() + 10
    while observer.execute(TABLE_READS).fetchone()[0] == reads_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert observer.execute(TABLE_READS).fetchone()[0] > reads_before
    assert observer.execute(CATALOG_COUNTS).fetchone() == catalog_before
    assert observer.execute(TABLE_WRITES).fetchall() == writes_before


def test_the_audit_transaction_writes_nothing(published_db):
    conn = published_db.connect(autocommit=False)
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        conn.execute(sqlfiles.statement(AUDIT_SQL, "session_settings"))
        for name in ("schema_probe", "findings", "flow_impact"):
            assert conn.execute(sqlfiles.statement(AUDIT_SQL, name)).fetchall()
        xid = conn.execute("SELECT pg_current_xact_id_if_assigned()").fetchone()[0]
        tuples = conn.execute(
            "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_xact_user_tables"
        ).fetchone()[0]
        temp = conn.execute("SELECT count(*) FROM pg_class WHERE relpersistence = 't'").fetchone()[0]
    assert xid is None  # no transaction id was ever needed: nothing was written, nothing created
    assert tuples == 0
    assert temp == 0


def test_unreachable_server_is_exit_3(tmp_path):
    port = free_port()
    result = run_cli("audit", "--dsn", f"host=127.0.0.1 port={port} user=postgres dbname=postgres",
                     "--connect-timeout", "3")
    assert result.code == ExitCode.CONNECTION
    assert "cannot connect" in result.stderr and f"127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.output


def test_wrong_password_is_exit_3_and_never_printed(harness):
    wrong = "Wr0ng-Secret-7733"
    dsn = f"postgresql://postgres:{wrong}@127.0.0.1:{harness.server.port}/postgres"
    for fmt in ("table", "json"):
        result = run_cli("audit", "--dsn", dsn, "--format", fmt)
        assert result.code == ExitCode.CONNECTION, result.output
        assert "authentication failed" in result.stderr
        assert wrong not in result.output
        assert harness.server.config.password not in result.output
        assert "Traceback" not in result.output
    assert json.loads(result.stderr)["exit_code"] == ExitCode.CONNECTION


def test_database_without_pgflow_is_exit_3(empty_db):
    result = cli(empty_db)
    assert result.code == ExitCode.CONNECTION
    assert "has no pgflow schema" in result.stderr
    assert "Traceback" not in result.output

    result = cli(empty_db, "--format", "json")
    assert result.stdout == ""
    error = json.loads(result.stderr)
    assert error["exit_code"] == 3 and "no pgflow schema" in error["message"]


def test_a_schema_named_pgflow_that_is_not_pgflow_is_exit_3(empty_db):
    conn = empty_db.connect()
    conn.execute("CREATE SCHEMA pgflow")
    conn.execute("CREATE TABLE pgflow.flows (id integer PRIMARY KEY, payload text)")
    result = cli(empty_db)
    assert result.code == ExitCode.CONNECTION
    assert "is not a pgflow schema" in result.stderr
    assert "missing tables: pgflow.steps, pgflow.runs, pgflow.step_states, pgflow.step_tasks" in result.stderr
    assert "missing columns: pgflow.flows.flow_slug" in result.stderr
    assert "Traceback" not in result.output


def test_pgflow_without_pgmq_is_exit_3(empty_db):
    conn = empty_db.connect()
    conn.execute(sqlfiles.load("migrations/0001_baseline_schema.sql"))
    result = cli(empty_db)
    assert result.code == ExitCode.CONNECTION
    assert "PGMQ is not installed" in result.stderr
    assert "Traceback" not in result.output


def test_control_characters_and_quotes_are_escaped_in_the_table(published_db):
    conn = published_db.connect()
    conn.execute("ALTER TABLE pgflow.flows DROP CONSTRAINT slug_is_valid")
    conn.execute("ALTER TABLE pgflow.steps DROP CONSTRAINT steps_step_slug_check")
    evil_flow = "evil\x1b[2J\nflow"
    evil_step = "it's \"quoted\"\ttab"
    evil_queue = "bell\x07queue"
    conn.execute("INSERT INTO pgflow.flows (flow_slug) VALUES (%s)", (evil_flow,))
    conn.execute("INSERT INTO pgflow.steps (flow_slug, step_slug, step_index) VALUES ('reindex', %s, 7)",
                 (evil_step,))
    conn.execute("SELECT pgmq.create(%s)", (evil_queue,))

    result = cli(published_db)
    assert result.code == ExitCode.FINDINGS, result.output
    for raw in ("\x1b", "\x07", "\t"):
        assert raw not in result.stdout
    assert "evil\\e[2J\\nflow" in result.stdout
    assert "it's \"quoted\"\\ttab" in result.stdout
    assert "bell\\x07queue" in result.stdout
    assert "Traceback" not in result.output

    result, doc = cli_json(published_db)
    found = {(f["check_id"], f["object_name"]): f for f in doc["findings"]}
    assert found["flow_slug_rejected", evil_flow]["reasons"] == ["invalid_character"]
    assert found["step_slug_rejected", evil_step]["reasons"] == ["invalid_character"]
    assert ("queue_unowned", evil_queue) in found
    assert ("flow_queue_missing", evil_flow.lower()) in found


def test_many_queues_are_estimated_instead_of_locked(baseline_db):
    """Exact counting locks every queue table until the end of the transaction; past the budget
    (4 x max_locks_per_transaction queue tables) the audit falls back to statistics."""
    conn = baseline_db.connect()
    budget = 4 * int(conn.execute("SHOW max_locks_per_transaction").fetchone()[0])
    with conn.transaction():
        conn.execute("SET LOCAL client_min_messages = warning")
        conn.execute("INSERT INTO pgflow.flows (flow_slug) SELECT 'flow_' || g FROM generate_series(1, %s) AS g",
                     (budget + 1,))
        conn.execute("SELECT pgmq.create('flow_' || g) FROM generate_series(1, %s) AS g", (budget + 1,))
        conn.execute("SELECT pgmq.send('flow_1', '{}'::jsonb) FROM generate_series(1, 3)")

    reader = baseline_db.connect(autocommit=False)
    with reader.transaction():
        reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        rows = reader.execute(sqlfiles.statement(AUDIT_SQL, "flow_impact")).fetchall()
        locks = reader.execute("SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid()").fetchone()[0]
    assert len(rows) == budget + 1
    assert locks < 100, locks

    from tests.audit.helpers import audit

    report = audit(baseline_db)
    flow_1 = next(i for i in report.flows if i.flow_slug == "flow_1")
    assert not flow_1.backlog_exact and flow_1.oldest_message_age_seconds is None
    assert flow_1.queue_backlog is not None  # the statistics' estimate (may lag behind)
    assert any("live-row estimates" in note for note in report.schema.notes)


def test_the_audit_never_opens_an_archive_table(published_db):
    """Archive sizes and row counts come from the catalog alone: an archive table that another
    session holds ACCESS EXCLUSIVE (VACUUM FULL, a partition maintenance job, a migration) neither
    delays nor fails the audit. Reading the size from the table itself (pg_total_relation_size)
    waited for that lock, one archive after the other."""
    from tests.audit.helpers import audit

    blocker = published_db.connect(autocommit=False)
    try:
        blocker.execute("LOCK TABLE pgmq.a_greetuser IN ACCESS EXCLUSIVE MODE")
        report = audit(published_db, lock_timeout=0.5)
    finally:
        blocker.rollback()
        blocker.close()
    greet = next(impact for impact in report.flows if impact.flow_slug == "greetUser")
    assert greet.archive_bytes and greet.archive_bytes > 0
    assert report.findings

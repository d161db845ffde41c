"""The phased (online) path: each phase commits on its own; an interrupted run resumes or aborts."""

from __future__ import annotations

import json

import psycopg
import pytest

from pgflow_cli import installer
from pgflow_cli.errors import ExitCode, LockTimeout
from tests.support.cli import run_cli
from tests.support.fingerprint import fingerprint
from tests.support.levels import versions_after
from tests.upgrade.conftest import BaselineDriver, bulk_finished_runs


def _states(conn):
    return {s.version: (s.state, s.recorded.phases_done if s.recorded else None) for s in installer.make_plan(conn).statuses}


def test_online_path_gives_the_same_result_in_small_batches(pre_upgrade):
    database, _state = pre_upgrade
    conn = database.connect()
    bulk_finished_runs(conn, 2000)  # 6,000 more tasks: the heap spans many pages
    events = []
    installer.apply(conn, online="always", batch_pages=10, progress=lambda e, d: events.append((e, d)))
    phases = [d["phase"] for e, d in events if e == "phase" and d["migration"].startswith("0003")]
    assert phases == ["prepare", "backfill", "validate", "index", "main"]
    batches = [d for e, d in events if e == "batch"]
    assert len(batches) >= 2 and sum(b["rows"] for b in batches) == conn.execute(
        "SELECT count(*) FROM pgflow.step_tasks").fetchone()[0]
    assert _states(conn)[3] == ("applied", [])
    assert conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE queue_name <> lower(flow_slug)").fetchone()[0] == 0
    index = conn.execute("SELECT indisvalid, indisunique FROM pg_index WHERE indexrelid = "
                         "'pgflow.idx_step_tasks_queue_message'::regclass").fetchone()
    assert index == (True, True)
    assert conn.execute("SELECT count(*) FROM pg_trigger WHERE tgname = 'step_tasks_fill_queue_name'").fetchone()[0] == 0


def _interrupt_main(database):
    """Run the phased path until its final transaction, which a blocker makes time out."""
    conn = database.connect()
    holder: dict = {}

    def progress(event, data):
        if event == "phase" and data["phase"] == "main":
            blocker = psycopg.connect(database.conninfo, application_name="pgflow-worker")
            blocker.execute("SELECT 1 FROM pgflow.flows LIMIT 1")  # ACCESS SHARE, kept by the open transaction
            holder["blocker"] = blocker

    with pytest.raises(LockTimeout):
        installer.apply(conn, online="always", lock_timeout=0.3, attempts=2, progress=progress)
    return conn, holder["blocker"]


def test_an_interrupted_run_keeps_the_old_behaviour_and_resumes(pre_upgrade):
    database, state = pre_upgrade
    conn, blocker = _interrupt_main(database)
    assert _states(conn)[3] == ("in_progress", ["prepare", "backfill", "validate", "index"])
    # until the final phase commits, the released runtime keeps working (protocol 1)
    assert conn.execute("SELECT pgflow.protocol_version()").fetchone()[0] == 1
    driver = BaselineDriver(conn, state.old_worker)
    run = driver.start("orderFlow", {"order": 99})
    [task] = driver.claim("orderFlow", run, "validate")
    driver.complete(task, {"ok": True})
    assert conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE queue_name IS NULL").fetchone()[0] == 0
    status = run_cli("migrate", "status", "--dsn", database.conninfo, "--format", "json")
    assert [m["state"] for m in json.loads(status.stdout)["migrations"]] == (
        ["applied", "applied", "in_progress"] + ["pending"] * len(versions_after(3)))
    blocker.rollback()
    blocker.close()

    resumed = run_cli("migrate", "apply", "--dsn", database.conninfo)
    assert resumed.code == ExitCode.OK, resumed.output
    assert "phase main" in resumed.stderr and "phase prepare" not in resumed.stderr
    assert _states(conn)[3] == ("applied", [])
    assert conn.execute("SELECT pgflow.protocol_version()").fetchone()[0] == 2


def test_abort_undoes_the_committed_phases(pre_upgrade):
    database, _state = pre_upgrade
    before = fingerprint(database.conninfo)
    conn, blocker = _interrupt_main(database)
    blocker.rollback()
    blocker.close()
    result = run_cli("migrate", "abort", "3", "--yes", "--dsn", database.conninfo)
    assert result.code == ExitCode.OK, result.output
    after = fingerprint(database.conninfo)
    assert (after.schema, after.data) == (before.schema, before.data)
    # the only trace: PostgreSQL keeps a dropped column's slot in pg_attribute
    assert [a for a in after.attributes if a[3]] and not [a for a in before.attributes if a[3]]
    assert 3 not in {s.version for s in installer.make_plan(conn).statuses if s.state != "pending"}
    again = run_cli("migrate", "abort", "3", "--yes", "--dsn", database.conninfo)
    assert again.code == ExitCode.CONFLICT and "not in progress" in again.stderr
    assert run_cli("migrate", "apply", "--dsn", database.conninfo).code == ExitCode.OK


def test_dry_run_reports_rows_and_locks_and_keeps_nothing(pre_upgrade):
    database, _state = pre_upgrade
    before = fingerprint(database.conninfo)
    result = run_cli("migrate", "apply", "--dry-run", "--format", "json", "--dsn", database.conninfo)
    assert result.code == ExitCode.OK, result.output
    doc = json.loads(result.stdout)
    assert doc["kind"] == "pgflow-cli/migrate-apply" and doc["dry_run"] and doc["applied"] == []
    phase = next(p for p in doc["phases"] if p["name"] == "apply 0003_queue_stage")
    touched = {r["table_name"]: r for r in phase["rows_touched"]}
    tasks = database.connect().execute("SELECT count(*) FROM pgflow.step_tasks").fetchone()[0]
    assert touched["pgflow.step_tasks"]["updated"] == tasks
    locks = {lock["relation"]: lock["modes"] for lock in phase["locks_held"]}
    assert "AccessExclusiveLock" in locks["pgflow.step_tasks"]
    assert fingerprint(database.conninfo).differences(before) == []


def test_sql_prints_the_pending_migration_for_review_and_changes_nothing(pre_upgrade):
    database, _state = pre_upgrade
    before = fingerprint(database.conninfo)
    result = run_cli("migrate", "apply", "--sql", "--dsn", database.conninfo)
    assert result.code == ExitCode.OK
    # a script psql runs as is (issue 16 item 4): a header, then one BEGIN ... COMMIT per migration
    assert result.stdout.startswith("-- pgflow-cli ")
    assert "\n-- ===== 0003_queue_stage (sha256 " in result.stdout
    assert "--@include" not in result.stdout  # included files are expanded
    assert "pgflow queue-stage upgrade refused" in result.stdout
    # the locks the runner takes first are statements now, in the lock order, before the first phase
    section = result.stdout.split("-- ===== 0003_queue_stage", 1)[1]
    locks = [line for line in section.split("-- phase prepare", 1)[0].splitlines() if line.startswith("LOCK TABLE")]
    assert locks[:5] == ['LOCK TABLE "pgflow"."flows" IN ACCESS EXCLUSIVE MODE;',
                         'LOCK TABLE "pgflow"."steps" IN ACCESS EXCLUSIVE MODE;',
                         'LOCK TABLE "pgflow"."runs" IN ACCESS EXCLUSIVE MODE;',
                         'LOCK TABLE "pgflow"."step_states" IN ACCESS EXCLUSIVE MODE;',
                         'LOCK TABLE "pgflow"."step_tasks" IN ACCESS EXCLUSIVE MODE;']
    assert fingerprint(database.conninfo).differences(before) == []


def test_ledger_conflicts_refuse_with_exit_6(pre_upgrade, published_db):
    database, _state = pre_upgrade
    conn = database.connect()
    conn.execute("UPDATE pgflow.schema_migrations SET checksum = 'x' WHERE version = 2")
    changed = run_cli("migrate", "apply", "--dsn", database.conninfo)
    assert changed.code == ExitCode.CONFLICT and "0002_baseline_runtime.sql" in changed.stderr
    conn.execute("UPDATE pgflow.schema_migrations SET checksum = %s WHERE version = 2",
                 (next(m for m in installer.available_migrations() if m.version == 2).checksum,))
    conn.execute("INSERT INTO pgflow.schema_migrations (version, name, checksum, tool_version, duration_ms) "
                 "VALUES (9999, 'from_the_future', 'y', '9.9.9', 1)")
    newer = run_cli("migrate", "status", "--dsn", database.conninfo)
    assert newer.code == ExitCode.CONFLICT and "newer than this tool" in newer.stderr and "9.9.9" in newer.stderr
    # a schema pgflow installed is adopted, unless it matches no published release
    published_db.connect().execute("ALTER TABLE pgflow.runs ADD COLUMN tenant text")
    foreign = run_cli("migrate", "apply", "--dsn", published_db.conninfo)
    assert foreign.code == ExitCode.CONFLICT and "matches no published release" in foreign.stderr


def test_backfill_page_numbers_beyond_smallint(pre_upgrade):
    """Page ranges past 32,767 must not overflow (the client sends small ints as smallint)."""
    database, _state = pre_upgrade
    conn = database.connect()
    migration = next(m for m in installer.available_migrations() if m.version == 3)
    backfill = next(p for p in migration.phased.phases if p.name == "backfill")
    conn.execute("ALTER TABLE pgflow.step_tasks ADD COLUMN queue_name text")  # what prepare adds
    row = conn.execute(backfill.sql, {"first_page": 32760, "pages": 100}).fetchone()
    assert row[0] == 0 and row[1] >= 1

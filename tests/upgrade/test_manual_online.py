"""Migration 0009 on a large task table (issues 8 and 14): exclusive locks only for metadata.

Above ``--@online-threshold`` task rows (forced here with ``online="always"``, the override the
0003 tests use, so the tables stay small) 0009 runs phase by phase: ``prepare`` (ACCESS EXCLUSIVE,
no scan: columns with constant defaults, DROP NOT NULL, the task checks NOT VALID), ``validate``
(SHARE UPDATE EXCLUSIVE), ``index`` (CREATE INDEX CONCURRENTLY) and ``main`` (functions only).
These tests check that the end state is the one-transaction path's, that the pre-0009 runtime's
claims and reports go on during the two scanning phases, that an interrupted run resumes or
aborts, and that a ledger holding the checksum of 0009's earlier (one-transaction) text is
accepted while any other checksum is still refused.
"""

from __future__ import annotations

import json
import threading

import psycopg
import pytest

from pgflow_cli import installer
from pgflow_cli.errors import ExitCode, LockTimeout
from pgflow_cli.installer.files import PREVIOUS_CHECKSUMS
from tests.layout.catalog import definitions
from tests.runtime.driver import Runtime
from tests.support.cli import run_cli
from tests.worker.helpers import wait_until

BEFORE = 3
"""Where the upgrade starts: levels 4-8 cannot be installed on their own by this tool (0010 changed
their function files again, docs/architecture.md "What an intermediate level means"); 3 is the
newest exact level, so each test applies 0004-0008 and 0009 in one run, 0009 phased."""
MANUAL = 9
FLOW = "busy"
INDEX = "pgflow.idx_step_tasks_manual_waiting"

TABLES = """
SELECT 'column ' || c.relname || '.' || a.attname,
       pg_catalog.format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
       || coalesce(' default ' || pg_catalog.pg_get_expr(d.adbin, d.adrelid), '')
       || coalesce(' -- ' || pg_catalog.col_description(c.oid, a.attnum), '')
FROM pg_catalog.pg_attribute AS a
JOIN pg_catalog.pg_class AS c ON c.oid = a.attrelid
LEFT JOIN pg_catalog.pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE c.relnamespace = 'pgflow'::regnamespace AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint ' || c.relname || '.' || k.conname,
       pg_catalog.pg_get_constraintdef(k.oid) || CASE WHEN k.convalidated THEN ' validated' ELSE ' NOT VALIDATED' END
FROM pg_catalog.pg_constraint AS k JOIN pg_catalog.pg_class AS c ON c.oid = k.conrelid
WHERE c.relnamespace = 'pgflow'::regnamespace
UNION ALL
SELECT 'index ' || ic.relname,
       pg_catalog.pg_get_indexdef(i.indexrelid) || CASE WHEN i.indisvalid THEN ' valid' ELSE ' INVALID' END
FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS ic ON ic.oid = i.indexrelid
WHERE ic.relnamespace = 'pgflow'::regnamespace
ORDER BY 1
"""


def _catalog(conn: psycopg.Connection) -> dict[str, str]:
    """Routines, types, views, triggers (with ACLs), plus columns, constraints and indexes."""
    return {**definitions(conn), **dict(conn.execute(TABLES).fetchall())}


def _before_0009(database) -> tuple[psycopg.Connection, Runtime]:
    """The database at level 3 (protocol 2) with a flow, finished work and a task in flight."""
    conn = database.connect()
    installer.apply(conn, target=BEFORE)
    # no server-side prepared statements: ``SELECT * FROM pgflow.complete_task(...)`` returns task
    # rows, whose type gains a column in prepare ("cached plan must not change result type")
    rt = Runtime(database.connect(prepare_threshold=None), "upgraded")
    rt.flow(FLOW, [{"slug": "a"}, {"slug": "b", "deps": ["a"]}], base_delay=0)
    for n in range(5):
        rt.start(FLOW, {"n": n})
    rt.drive(FLOW, lambda task: {"ok": True})
    rt.start(FLOW, {"n": "in flight"})
    assert rt.poll(FLOW)  # claimed, never reported: a started task crosses the upgrade
    return conn, rt


def _claim_and_complete(rt: Runtime) -> None:
    """What a protocol-2 worker does: start a run, read and claim its task, report it."""
    run = rt.start(FLOW, {"n": "during"})
    [task] = [t for t in rt.poll(FLOW) if t["run_id"] == run]
    rt.complete(task["run_id"], task["step_slug"], task["task_index"], {"ok": True})


def _states(conn: psycopg.Connection) -> dict[int, tuple[str, list[str] | None]]:
    return {s.version: (s.state, s.recorded.phases_done if s.recorded else None)
            for s in installer.make_plan(conn).statuses}


def _wait_for(conn: psycopg.Connection, query: str, params: tuple, *, deadline: float = 30.0) -> None:
    wait_until(lambda: conn.execute(query, params).fetchone()[0], f"{query} {params}", timeout=deadline, interval=0.01)


def test_the_phased_path_ends_where_one_transaction_does(baseline_db, db):
    conn, _rt = _before_0009(baseline_db)
    events: list[tuple[str, dict]] = []
    applied = installer.apply(conn, online="always", progress=lambda e, d: events.append((e, d)))
    manual = next(a for a in applied if a.migration.version == MANUAL)
    assert manual.online
    assert [d["phase"] for e, d in events if e == "phase" and d["migration"].startswith("0009")] == [
        "prepare", "validate", "index", "main"]
    upgraded = _catalog(conn)
    with db.connect() as fresh:  # every migration, each in one transaction
        assert upgraded == _catalog(fresh)
    assert not [name for name, text in upgraded.items() if text.endswith((" NOT VALIDATED", " INVALID"))]
    assert upgraded["index idx_step_tasks_manual_waiting"].endswith(" valid")
    assert conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE execution_mode <> 'queue'").fetchone()[0] == 0


def test_claims_and_reports_go_on_while_the_checks_validate_and_the_index_builds(baseline_db):
    _conn, rt = _before_0009(baseline_db)
    # an open worker transaction that claimed and reported after prepare committed: validate
    # must commit beside it, and the concurrent index build waits for it (without blocking others)
    open_worker = psycopg.connect(baseline_db.conninfo, application_name="open-worker", prepare_threshold=None)
    open_rt = Runtime(open_worker, "upgraded")
    seen: dict[str, object] = {}

    def progress(event: str, data: dict) -> None:
        if not data.get("migration", "").startswith("0009"):
            return
        if event == "phase" and data["phase"] == "validate":
            _claim_and_complete(open_rt)
        if event == "phase_done" and data["phase"] == "validate":
            seen["validated_beside_open_worker"] = (
                open_worker.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS)

    migrator = psycopg.connect(baseline_db.conninfo, autocommit=True, application_name="phase9-migrator")
    pid = migrator.info.backend_pid
    result: dict[str, object] = {}

    def migrate() -> None:
        try:
            result["applied"] = installer.apply(migrator, online="always", lock_timeout=60, progress=progress)
        except BaseException as exc:  # reported by the main thread
            result["error"] = exc

    thread = threading.Thread(target=migrate)
    thread.start()
    observer = baseline_db.connect()
    try:
        _wait_for(observer, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock' "
                  "AND query LIKE 'CREATE INDEX CONCURRENTLY%%idx_step_tasks_manual_waiting%%')", (pid,))
        assert seen["validated_beside_open_worker"] is True
        # the build is waiting for the open worker: another worker claims and reports meanwhile
        rt.conn.execute("SET lock_timeout = '5s'")
        _claim_and_complete(rt)
        assert observer.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                (pid,)).fetchone()[0] == "Lock"  # still building: the claim did not wait for it
    finally:
        open_worker.commit()
        thread.join(120)
    assert "error" not in result, result.get("error")
    assert _states(observer)[MANUAL] == ("applied", [])
    assert observer.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass",
                            (INDEX,)).fetchone()[0] is True
    open_worker.close()
    migrator.close()


def _interrupt_before_validate(database) -> tuple[psycopg.Connection, dict[str, str]]:
    """Run 0009's phased path until ``validate``, which a held SHARE UPDATE EXCLUSIVE makes time out.

    Returns the migrator's connection and the catalog just before 0009 started (0004-0008 applied).
    """
    conn = database.connect()
    blocker = psycopg.connect(database.conninfo, application_name="vacuum-like")
    before: dict[str, str] = {}

    def progress(event: str, data: dict) -> None:
        if event == "start" and data["migration"].startswith("0009"):
            with database.connect() as observer:
                before.update(_catalog(observer))
        if event == "phase" and data["migration"].startswith("0009") and data["phase"] == "validate":
            blocker.execute("LOCK TABLE pgflow.step_tasks IN SHARE UPDATE EXCLUSIVE MODE")

    with pytest.raises(LockTimeout):
        installer.apply(conn, online="always", lock_timeout=0.3, attempts=2, progress=progress)
    blocker.rollback()
    blocker.close()
    assert _states(conn)[MANUAL] == ("in_progress", ["prepare"])
    return conn, before


def test_an_interrupted_run_keeps_before_0009_working_and_resumes(baseline_db):
    _conn, rt = _before_0009(baseline_db)
    conn, _before = _interrupt_before_validate(baseline_db)
    _claim_and_complete(rt)  # the pre-0009 runtime runs on the prepared table
    status = run_cli("migrate", "status", "--dsn", baseline_db.conninfo, "--format", "json")
    assert {m["version"]: m["state"] for m in json.loads(status.stdout)["migrations"]}[MANUAL] == "in_progress"
    resumed = run_cli("migrate", "apply", "--dsn", baseline_db.conninfo, "--online", "always")
    assert resumed.code == ExitCode.OK, resumed.output
    assert "phase validate" in resumed.stderr and "phase prepare" not in resumed.stderr
    assert _states(conn)[MANUAL] == ("applied", [])


def test_abort_returns_to_before_0009_and_a_rerun_applies(baseline_db, db):
    conn, rt = _before_0009(baseline_db)
    _conn, before = _interrupt_before_validate(baseline_db)
    assert before
    aborted = run_cli("migrate", "abort", str(MANUAL), "--dsn", baseline_db.conninfo, "--yes")
    assert aborted.code == ExitCode.OK, aborted.output
    assert _catalog(conn) == before
    assert MANUAL not in _states(conn) or _states(conn)[MANUAL][0] == "pending"
    _claim_and_complete(rt)
    installer.apply(conn, online="always")
    with db.connect() as fresh:
        assert _catalog(conn) == _catalog(fresh)


def test_a_ledger_of_the_earlier_0009_text_is_accepted(db):
    # Built by writing the earlier text's checksum into a fresh ledger: both texts end in the same
    # state (test_the_phased_path_ends_where_one_transaction_does), so the row is all that differs.
    [earlier] = PREVIOUS_CHECKSUMS["migrations/0009_manual_tasks.sql"]
    conn = db.connect()
    conn.execute("UPDATE pgflow.schema_migrations SET checksum = %s WHERE version = %s", (earlier, MANUAL))
    status = run_cli("migrate", "status", "--dsn", db.conninfo, "--format", "json")
    assert status.code == ExitCode.OK, status.output
    assert {m["version"]: m["state"] for m in json.loads(status.stdout)["migrations"]}[MANUAL] == "applied"
    applied = run_cli("migrate", "apply", "--dsn", db.conninfo)
    assert applied.code == ExitCode.OK, applied.output
    # nothing new recorded: the row keeps the earlier checksum
    assert conn.execute("SELECT checksum FROM pgflow.schema_migrations WHERE version = %s",
                        (MANUAL,)).fetchone()[0] == earlier


def test_any_other_checksum_is_still_refused(db):
    conn = db.connect()
    conn.execute("UPDATE pgflow.schema_migrations SET checksum = repeat('ab', 32) WHERE version = %s", (MANUAL,))
    status = run_cli("migrate", "status", "--dsn", db.conninfo, "--format", "json")
    assert {m["version"]: m["state"] for m in json.loads(status.stdout)["migrations"]}[MANUAL] == "changed"
    applied = run_cli("migrate", "apply", "--dsn", db.conninfo)
    assert applied.code == ExitCode.CONFLICT, applied.output

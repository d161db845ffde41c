"""The manual-task part of 0003's phased plan on a large task table: exclusive locks only for metadata.

Above ``--@online-threshold`` task rows (forced here with ``online="always"``, so the tables stay
small) 0003 runs phase by phase; what manual steps need rides along: ``prepare`` adds
``step_tasks.execution_mode`` (constant default: no rewrite) and both task checks NOT VALID under a
short ACCESS EXCLUSIVE lock, ``validate`` validates them (SHARE UPDATE EXCLUSIVE), ``index`` builds
the manual-waiting index CONCURRENTLY. These tests check that the end state is the one-transaction
path's, and that the baseline runtime's claims and reports go on during the two scanning phases and
after a run stopped before validate, which then resumes.
"""

from __future__ import annotations

import json
import threading

import psycopg
import pytest

from pgflow_cli import installer
from pgflow_cli.errors import ExitCode, LockTimeout
from tests.layout.catalog import definitions
from tests.runtime.driver import Runtime
from tests.support.cli import run_cli
from tests.worker.helpers import wait_until

STAGE = 3
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


def _baseline_with_work(database) -> tuple[psycopg.Connection, Runtime]:
    """The baseline database (protocol 1) with a flow, finished work and a task in flight."""
    conn = database.connect()
    # no server-side prepared statements: ``SELECT * FROM pgflow.complete_task(...)`` returns task
    # rows, whose type gains columns in prepare ("cached plan must not change result type")
    rt = Runtime(database.connect(prepare_threshold=None), "baseline")
    rt.flow(FLOW, [{"slug": "a"}, {"slug": "b", "deps": ["a"]}], base_delay=0)
    for n in range(5):
        rt.start(FLOW, {"n": n})
    rt.drive(FLOW, lambda task: {"ok": True})
    rt.start(FLOW, {"n": "in flight"})
    assert rt.poll(FLOW)  # claimed, never reported: a started task crosses the upgrade
    return conn, rt


def _claim_and_complete(rt: Runtime) -> None:
    """What a baseline (protocol-1) worker does: start a run, read and claim its task, report it."""
    run = rt.start(FLOW, {"n": "during"})
    [task] = [t for t in rt.poll(FLOW) if t["run_id"] == run]
    rt.complete(task["run_id"], task["step_slug"], task["task_index"], {"ok": True})


def _states(conn: psycopg.Connection) -> dict[int, tuple[str, list[str] | None]]:
    return {s.version: (s.state, s.recorded.phases_done if s.recorded else None)
            for s in installer.make_plan(conn).statuses}


def _wait_for(conn: psycopg.Connection, query: str, params: tuple, *, deadline: float = 30.0) -> None:
    wait_until(lambda: conn.execute(query, params).fetchone()[0], f"{query} {params}", timeout=deadline, interval=0.01)


def test_the_phased_path_ends_where_one_transaction_does(baseline_db, db):
    conn, _rt = _baseline_with_work(baseline_db)
    events: list[tuple[str, dict]] = []
    [stage] = installer.apply(conn, online="always", progress=lambda e, d: events.append((e, d)))
    assert stage.migration.version == STAGE and stage.online
    assert [d["phase"] for e, d in events if e == "phase"] == ["prepare", "backfill", "validate", "index", "main"]
    upgraded = _catalog(conn)
    with db.connect() as fresh:  # every migration, each in one transaction
        assert upgraded == _catalog(fresh)
    assert not [name for name, text in upgraded.items() if text.endswith((" NOT VALIDATED", " INVALID"))]
    assert upgraded["index idx_step_tasks_manual_waiting"].endswith(" valid")
    assert conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE execution_mode <> 'queue'").fetchone()[0] == 0


def test_claims_and_reports_go_on_while_the_checks_validate_and_the_index_builds(baseline_db):
    _conn, rt = _baseline_with_work(baseline_db)
    # an open worker transaction that claimed and reported after prepare committed: validate
    # must commit beside it, and the concurrent index build waits for it (without blocking others)
    open_worker = psycopg.connect(baseline_db.conninfo, application_name="open-worker", prepare_threshold=None)
    open_rt = Runtime(open_worker, "baseline")
    seen: dict[str, object] = {}

    def progress(event: str, data: dict) -> None:
        if event == "phase" and data["phase"] == "validate":
            _claim_and_complete(open_rt)
        if event == "phase_done" and data["phase"] == "validate":
            seen["validated_beside_open_worker"] = (
                open_worker.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS)

    migrator = psycopg.connect(baseline_db.conninfo, autocommit=True, application_name="stage-migrator")
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
                  "AND query LIKE 'CREATE %%INDEX CONCURRENTLY%%')", (pid,))
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
    assert _states(observer)[STAGE] == ("applied", [])
    assert observer.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass",
                            (INDEX,)).fetchone()[0] is True
    open_worker.close()
    migrator.close()


def test_a_run_stopped_before_validate_keeps_the_baseline_working_and_resumes(baseline_db, db):
    _conn, rt = _baseline_with_work(baseline_db)
    conn = baseline_db.connect()
    blocker = psycopg.connect(baseline_db.conninfo, application_name="vacuum-like")

    def progress(event: str, data: dict) -> None:
        if event == "phase" and data["phase"] == "validate":
            blocker.execute("LOCK TABLE pgflow.step_tasks IN SHARE UPDATE EXCLUSIVE MODE")

    with pytest.raises(LockTimeout):
        installer.apply(conn, online="always", lock_timeout=0.3, attempts=2, progress=progress)
    blocker.rollback()
    blocker.close()
    assert _states(conn)[STAGE] == ("in_progress", ["prepare", "backfill"])
    # the baseline runtime runs on the prepared table: its new tasks get their queue and the
    # execution mode's default, which the checks (NOT VALID so far) accept
    _claim_and_complete(rt)
    assert conn.execute("SELECT count(*) FROM pgflow.step_tasks WHERE queue_name IS NULL "
                        "OR execution_mode <> 'queue'").fetchone()[0] == 0
    status = run_cli("migrate", "status", "--dsn", baseline_db.conninfo, "--format", "json")
    assert {m["version"]: m["state"] for m in json.loads(status.stdout)["migrations"]}[STAGE] == "in_progress"
    resumed = run_cli("migrate", "apply", "--dsn", baseline_db.conninfo, "--online", "always")
    assert resumed.code == ExitCode.OK, resumed.output
    assert "phase validate" in resumed.stderr and "phase prepare" not in resumed.stderr
    assert _states(conn)[STAGE] == ("applied", [])
    with db.connect() as fresh:
        assert _catalog(conn) == _catalog(fresh)

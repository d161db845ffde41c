"""``pgflow migrate status`` tells the truth, and Ctrl-C during ``apply`` says what it left (issue 14 item 7)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from pgflow_cli import installer
from pgflow_cli.errors import ExitCode
from tests.support.cli import communicate_or_dump, run_cli, sigint_as_at_a_terminal, with_stack_dumps
from tests.support.levels import versions_after
from tests.upgrade.conftest import build_pre_upgrade

INDEX = "pgflow.idx_step_tasks_queue_message"


class _Stop(Exception):
    pass


def _stop_before(phase_name: str):
    def progress(event: str, data: dict) -> None:
        if event == "phase" and data["phase"] == phase_name:
            raise _Stop()
    return progress


def _status(database) -> tuple[int, dict, str]:
    table = run_cli("migrate", "status", "--dsn", database.conninfo)
    doc = run_cli("migrate", "status", "--dsn", database.conninfo, "--format", "json")
    assert doc.code == table.code, (table.output, doc.output)
    return table.code, json.loads(doc.stdout), " ".join(table.output.split())  # rich wraps long lines


def test_a_stopped_phased_run_is_in_progress_not_up_to_date(baseline_db):
    conn = baseline_db.connect()
    with pytest.raises(_Stop):
        installer.apply(conn, online="always", progress=_stop_before("main"))
    code, doc, text = _status(baseline_db)
    assert code == ExitCode.FINDINGS, text
    assert "up to date" not in text
    # the commands repeat the --dsn the status was given (issue 16 item 2)
    assert "IN PROGRESS" in text and re.search(r"pgflow migrate abort --dsn '[^']*' 3", text) \
        and "pgflow migrate apply --dsn " in text
    assert doc["verdict"] == "in_progress"
    assert doc["pending"] == [3, *versions_after(3)]
    assert doc["in_progress"] == [{"version": 3, "phases_done": ["prepare", "backfill", "validate", "index"]}]


def test_an_invalid_index_is_reported(baseline_db):
    conn = baseline_db.connect()
    with pytest.raises(_Stop):
        installer.apply(conn, online="always", progress=_stop_before("main"))
    conn.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s::regclass", (INDEX,))
    code, doc, text = _status(baseline_db)
    assert code == ExitCode.FINDINGS
    assert doc["invalid_indexes"] == [INDEX] and f"index {INDEX} is INVALID" in text


def test_a_checksum_mismatch_and_a_newer_database_are_not_up_to_date(db):
    conn = db.connect()
    conn.execute("UPDATE pgflow.schema_migrations SET checksum = 'x' WHERE version = 3")
    code, doc, text = _status(db)
    assert code == ExitCode.CONFLICT and "up to date" not in text.replace("NOT up to date", "")
    assert doc["verdict"] == "conflict" and doc["changed"] == [3] and doc["conflict"]["exit_code"] == 6
    conn.execute("UPDATE pgflow.schema_migrations SET checksum = %s WHERE version = 3",
                 (next(m for m in installer.available_migrations() if m.version == 3).checksum,))
    conn.execute("INSERT INTO pgflow.schema_migrations (version, name, checksum, tool_version, duration_ms) "
                 "VALUES (9999, 'from_the_future', 'y', '9.9.9', 1)")
    code, doc, text = _status(db)
    assert code == ExitCode.CONFLICT and "NOT up to date" in text and "newer than this tool" in text
    assert doc["verdict"] == "conflict" and doc["unknown"] == [9999] and doc["pending"] == []


def test_up_to_date_and_pending_are_exit_0(db, baseline_db):
    code, doc, text = _status(db)
    assert (code, doc["verdict"]) == (0, "up_to_date") and "up to date" in text
    code, doc, text = _status(baseline_db)
    later = versions_after(3)
    assert (code, doc["verdict"], doc["pending"]) == (0, "pending", [3, *later]) and f"{1 + len(later)} pending" in text


def test_ctrl_c_during_a_concurrent_build_says_what_it_left(baseline_db):
    build_pre_upgrade(baseline_db.conninfo)
    conn = baseline_db.connect()
    # an old snapshot (no table lock, so the earlier phases go through): a concurrent build waits
    # for it after creating its index, so Ctrl-C catches the build mid-way
    blocker = psycopg.connect(baseline_db.conninfo, application_name="old-reader")
    blocker.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    blocker.execute("SELECT 1")
    env = with_stack_dumps({k: v for k, v in os.environ.items() if not k.startswith("PG")})
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgflow_cli", "migrate", "apply", "--dsn", baseline_db.conninfo, "--online", "always",
         "--lock-timeout", "600"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True, preexec_fn=sigint_as_at_a_terminal)
    try:
        deadline = time.monotonic() + 120
        while not conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid)) "
                "AND query ILIKE 'CREATE UNIQUE INDEX CONCURRENTLY%%'", (blocker.info.backend_pid,)).fetchone()[0]:
            assert proc.poll() is None and time.monotonic() < deadline, "the build never waited for the old writer"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _out, err = communicate_or_dump(proc, timeout=60)
        err = " ".join(err.split())
    finally:
        if proc.poll() is None:
            proc.kill()
        blocker.rollback()
        blocker.close()
    assert proc.returncode == ExitCode.INTERRUPTED, err
    assert "0003_queue_stage is left in progress" in err
    assert f"index {INDEX} is INVALID" in err
    assert re.search(r"pgflow migrate abort --dsn '[^']*' 3", err) and "pgflow migrate apply --dsn " in err
    code, doc, _text = _status(baseline_db)
    assert code == ExitCode.FINDINGS and doc["invalid_indexes"] == [INDEX]
    resumed = run_cli("migrate", "apply", "--dsn", baseline_db.conninfo)
    assert resumed.code == ExitCode.OK, resumed.output
    assert f"dropping invalid index {INDEX}" in resumed.stderr
    assert _status(baseline_db)[1]["verdict"] == "up_to_date"

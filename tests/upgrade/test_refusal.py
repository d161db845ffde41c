"""Incompatible data refuses the upgrade with the complete list and leaves the database as it was."""

from __future__ import annotations

import json

import psycopg
import pytest

from pgflow_cli import installer
from pgflow_cli.db import Target
from pgflow_cli.errors import ExitCode
from pgflow_cli.operations import migrate as migrate_op
from pgflow_cli.worker import Flow, ProtocolV1
from tests.support.cli import run_cli
from tests.support.fingerprint import fingerprint
from tests.support.levels import versions_after
from tests.upgrade.conftest import build_pre_upgrade


def _legacy_flows(conn: psycopg.Connection) -> None:
    """Definitions the released rule accepted and the new rules reject, made by a released worker."""
    protocol = ProtocolV1()
    for flow in (
        Flow("_legacyImport", legacy_slugs=True).step("load", lambda r, c: r),
        Flow("report__daily", legacy_slugs=True).step("render_", lambda r, c: r),
        Flow("etl", legacy_slugs=True).step("loadData", lambda r, c: r).step("LoadData", lambda r, c: r),
    ):
        protocol.compile(conn, flow.slug, flow.shape(), None)
    conn.execute("SELECT pgflow.start_flow('_legacyImport', '{}')")


def test_cli_refuses_with_every_offender_and_changes_nothing(baseline_db):
    build_pre_upgrade(baseline_db.conninfo)
    _legacy_flows(baseline_db.connect())
    before = fingerprint(baseline_db.conninfo)

    result = run_cli("migrate", "apply", "--dsn", baseline_db.conninfo, "--format", "json")
    assert result.code == ExitCode.FINDINGS
    assert result.stdout == ""
    error = json.loads(result.stderr)
    assert error["exit_code"] == 1 and "refused" in error["message"]
    detail = "\n".join(error["detail"])
    for offender in ("flow _legacyImport", "flow report__daily", "step render_", "step loadData", "step LoadData"):
        assert offender in detail
    assert "pgflow audit" in error["hint"]
    assert fingerprint(baseline_db.conninfo).differences(before) == []


def test_recheck_under_the_locks_refuses_even_without_the_preflight(baseline_db):
    """The migration's own recheck (not the Python preflight) is what guarantees the rules."""
    conn = baseline_db.connect()
    installer.ensure_pgmq(conn)
    _legacy_flows(conn)
    before = fingerprint(baseline_db.conninfo)
    with pytest.raises(psycopg.Error) as info:
        installer.apply(conn)
    assert info.value.sqlstate == "PF005"
    detail = info.value.diag.message_detail or ""
    assert "flow_slug_rejected _legacyImport" in detail and "step_slug_rejected render_" in detail
    assert "step_slug_case_conflict LoadData" in detail and "step_slug_case_conflict loadData" in detail
    assert fingerprint(baseline_db.conninfo).differences(before) == []
    assert [s.state for s in installer.make_plan(conn).statuses] == ["applied", "applied"] + ["pending"] * (1 + len(versions_after(3)))


def test_a_collision_created_after_the_preflight_is_caught_by_the_recheck(baseline_db):
    build_pre_upgrade(baseline_db.conninfo)
    conn = baseline_db.connect()
    other = baseline_db.connect()
    snapshot = {}

    def progress(event, data):
        if event == "preflight":  # the preflight passed; the locks are not taken yet
            other.execute("SELECT pgflow.create_flow('OrderFlow')")  # case alias of orderFlow (released rule allows it)
            snapshot["before"] = fingerprint(baseline_db.conninfo)

    with pytest.raises(psycopg.Error) as info:
        migrate_op.apply(conn, Target(baseline_db.conninfo, "test"), progress=progress)
    assert info.value.sqlstate == "PF005"
    assert "OrderFlow" in (info.value.diag.message_detail or "")
    assert fingerprint(baseline_db.conninfo).differences(snapshot["before"]) == []


def test_status_and_plan_show_the_refusal_without_locking(baseline_db):
    conn = baseline_db.connect()
    _legacy_flows(conn)
    plan = run_cli("migrate", "plan", "--dsn", baseline_db.conninfo)
    assert plan.code == ExitCode.FINDINGS
    assert "0003_queue_stage" in plan.stdout and "refused" in plan.stderr
    status = run_cli("migrate", "status", "--dsn", baseline_db.conninfo, "--format", "json")
    assert status.code == ExitCode.OK
    assert json.loads(status.stdout)["pending"] == [3, *versions_after(3)]

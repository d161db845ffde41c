"""The least-privilege worker role of docs/permissions.md runs the reference worker end to end.

The role gets exactly the grants the doc lists (nothing on PUBLIC, no superuser, no ownership),
compiles a new flow (which creates its PGMQ queue), registers, claims, completes, and a run
finishes. Without the grants, startup fails on a permission error before anything is registered.
"""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from pgflow_cli.worker import Flow, Worker, WorkerOptions

ROLE_GRANTS = """
GRANT USAGE ON SCHEMA pgflow TO {role};
GRANT USAGE, CREATE ON SCHEMA pgmq TO {role};
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgflow TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgflow TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgmq TO {role};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA pgmq TO {role};
"""
"""The worker recipe of docs/permissions.md, verbatim (the doc test below keeps them in step)."""


def _role(conn, name: str) -> str:
    conn.execute(f'CREATE ROLE "{name}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE')
    return name


def test_the_documented_worker_grants_are_enough(db):
    admin = db.connect()
    role = _role(admin, f"worker_{uuid.uuid4().hex[:8]}")
    admin.execute(ROLE_GRANTS.format(role=f'"{role}"'))
    conninfo = f"{db.conninfo} user={role}"

    flow = Flow("grantedFlow").step("a", lambda run, ctx: run["n"] + 1).step("b", lambda d, ctx: d["a"] * 2, depends_on=["a"])
    worker = Worker(flow, conninfo, function_name="granted-worker",
                    options=WorkerOptions(max_poll_seconds=1, heartbeat_interval=1))
    worker.start()
    try:
        run_id = admin.execute("SELECT run_id FROM pgflow.start_flow('grantedFlow', '{\"n\": 1}')").fetchone()[0]
        deadline = time.monotonic() + 30
        while admin.execute("SELECT status FROM pgflow.runs WHERE run_id = %s", (run_id,)).fetchone()[0] == "started":
            assert time.monotonic() < deadline, "the run did not finish"
            time.sleep(0.1)
    finally:
        worker.stop()
        assert worker.join(30)
    assert admin.execute("SELECT status, output FROM pgflow.runs WHERE run_id = %s", (run_id,)).fetchone() == (
        "completed", {"b": 4})
    assert worker.fatal is None
    # the grants were not widened for everybody
    public = admin.execute(
        "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = 'pgflow' AND has_function_privilege('public', p.oid, 'EXECUTE')").fetchone()[0]
    assert public == 0


def test_without_the_grants_the_worker_fails_before_registering(db):
    admin = db.connect()
    role = _role(admin, f"nogrant_{uuid.uuid4().hex[:8]}")
    worker = Worker(Flow("deniedFlow").step("a", lambda r, c: r), f"{db.conninfo} user={role}",
                    function_name="denied-worker")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        worker.start()
    assert worker.state == "stopped"
    assert admin.execute("SELECT count(*) FROM pgflow.workers").fetchone()[0] == 0
    assert admin.execute("SELECT count(*) FROM pgflow.flows").fetchone()[0] == 0


def test_the_doc_lists_exactly_these_grants():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "permissions.md").read_text(encoding="utf-8")
    for line in ROLE_GRANTS.strip().splitlines():
        assert line.format(role="pgflow_worker") in doc, line

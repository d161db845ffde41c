"""Who may cancel, retry and resume runs: the owner of the pgflow tables or a member of
pgflow_operator, with the recipe of docs/permissions.md "Run operators". EXECUTE alone is not
enough (the worker recipe grants EXECUTE on every pgflow function); PUBLIC gets nothing."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg

from pgflow_cli.errors import ExitCode
from tests.permissions.test_worker_role import ROLE_GRANTS
from tests.runtime.driver import raises_sqlstate
from tests.support.cli import run_cli

RUN_OPERATOR_GRANTS = """
GRANT USAGE ON SCHEMA pgflow, pgmq TO pgflow_operator;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgflow TO pgflow_operator;
GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA pgflow TO pgflow_operator;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgmq TO pgflow_operator;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA pgmq TO pgflow_operator;
"""
"""The run operator recipe of docs/permissions.md, verbatim (test_the_doc_lists_these_grants)."""

OPERATIONS = ("pgflow.cancel_run(uuid, text)", "pgflow.retry_run(uuid)", "pgflow.resume_run(uuid)")


def _login(admin: psycopg.Connection, prefix: str) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin.execute(f'CREATE ROLE "{name}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE')
    return name


def _as(db, role: str) -> psycopg.Connection:
    conn = psycopg.connect(f"{db.conninfo} user={role}", autocommit=True)
    db._connections.append(conn)
    return conn


def test_only_the_owner_or_an_operator_may_cancel_retry_or_resume(rt, db):
    admin = rt.conn
    admin.execute("DO $$ BEGIN CREATE ROLE pgflow_operator NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    worker, bob = _login(admin, "worker"), _login(admin, "bob")
    admin.execute(ROLE_GRANTS.format(role=f'"{worker}"'))
    rt.flow("ops", [{"slug": "each", "step_type": "map"}], max_attempts=1, base_delay=0)
    admin.execute(RUN_OPERATOR_GRANTS)  # after the flow's queue exists (or default privileges)
    admin.execute(f'GRANT pgflow_operator TO "{bob}"')
    run_id = rt.start("ops", [1, 2])

    for fn in OPERATIONS + ("pgflow._lock_restart_source(text, uuid)",):
        assert rt.val("SELECT has_function_privilege('public', %s, 'EXECUTE')", (fn,)) is False, fn
    as_worker = _as(db, worker)
    for call in ("cancel_run(%s)", "retry_run(%s)", "resume_run(%s)"):
        with raises_sqlstate("42501", f'role "{worker}" may not'):
            as_worker.execute(f"SELECT * FROM pgflow.{call}", (run_id,))
    assert rt.run(run_id)["status"] == "started"

    as_bob = _as(db, bob)
    rt.poll("ops")
    rt.complete(run_id, "each", 0, {"done": 0})
    assert as_bob.execute("SELECT status FROM pgflow.cancel_run(%s, 'by bob')", (run_id,)).fetchone()[0] == "failed"
    assert rt.run(run_id)["cancelled_by"] == bob
    resumed = as_bob.execute("SELECT run_id FROM pgflow.resume_run(%s)", (run_id,)).fetchone()[0]
    retried = as_bob.execute("SELECT run_id FROM pgflow.retry_run(%s)", (run_id,)).fetchone()[0]
    assert [t["status"] for t in rt.tasks(resumed)] == ["completed", "queued"]
    assert [t["status"] for t in rt.tasks(retried)] == ["queued", "queued"]


def test_the_doc_lists_these_grants():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "permissions.md").read_text(encoding="utf-8")
    for line in RUN_OPERATOR_GRANTS.strip().splitlines():
        assert line in doc, line


def test_roles_granted_before_the_upgrade_get_on_the_run_records_what_they_hold_on_runs(baseline_db):
    with baseline_db.connect() as admin:
        worker, reader, stranger = (_login(admin, prefix) for prefix in ("worker", "reader", "stranger"))
        admin.execute(ROLE_GRANTS.format(role=f'"{worker}"'))
        admin.execute(f'GRANT USAGE ON SCHEMA pgflow TO "{reader}"; GRANT SELECT ON pgflow.runs TO "{reader}"')
    applied = run_cli("migrate", "apply", "--dsn", baseline_db.conninfo)
    assert applied.code == ExitCode.OK, applied.output

    privileges = ("SELECT", "INSERT", "UPDATE", "DELETE")
    held = ("SELECT p FROM unnest(%s::text[]) AS p WHERE has_table_privilege(%s, %s::regclass, p) ORDER BY 1")
    with baseline_db.connect() as admin:
        for role, expected in ((worker, sorted(privileges)), (reader, ["SELECT"]), (stranger, [])):
            for table in ("pgflow.runs", "pgflow.run_restarts", "pgflow.run_cancellations"):
                assert [r[0] for r in admin.execute(held, (list(privileges), role, table))] == expected, (role, table)
        for table in ("pgflow.run_restarts", "pgflow.run_cancellations"):
            assert not admin.execute("SELECT has_table_privilege('public', %s::regclass, 'SELECT')", (table,)).fetchone()[0]
        admin.execute("SELECT pgflow.create_flow('granted'); SELECT pgflow.add_step('granted', 'a')")
        # the new flow's queue, as docs/permissions.md says for queues created later
        admin.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgmq TO "{worker}"')
    # a run start looks for a restart (run_restarts) as its steps start: the worker role, granted
    # before the upgrade, still starts runs
    as_worker = _as(baseline_db, worker)
    run_id = as_worker.execute("SELECT run_id FROM pgflow.start_flow('granted', '{}')").fetchone()[0]
    assert as_worker.execute("SELECT status FROM pgflow.step_states WHERE run_id = %s", (run_id,)).fetchone()[0] == "started"

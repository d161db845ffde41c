"""Security boundary of the manual entry points: server-only, caller's rights, one documented grant.

* PUBLIC, ``anon`` and ``authenticated`` cannot execute them; both are SECURITY INVOKER with an
  empty search_path;
* the trusted server role of docs/permissions.md ("Trusted server code") completes and fails
  manual tasks, including the progression that sends the next step's messages and cancels others;
* with EXECUTE on the entry points alone a role is refused (the caller's rights apply), nothing changes;
* the manual paths never call PGMQ themselves.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_cli.worker.flow import Flow
from tests.support.roles import ensure_group

ENTRY_POINTS = ("pgflow.complete_manual_task(uuid, text, integer, jsonb)",
                "pgflow.fail_manual_task(uuid, text, integer, text)")

TRUSTED_GRANTS = """
GRANT USAGE ON SCHEMA pgflow, pgmq TO {role};
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgflow TO {role};
GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA pgflow TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgmq TO {role};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA pgmq TO {role};
"""
"""The trusted-server recipe of docs/permissions.md, verbatim (the doc test keeps them in step)."""


def _role(conn, prefix: str) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    conn.execute(f'CREATE ROLE "{name}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE')
    return name


@pytest.fixture
def client_roles(db, client_role_names):
    """Supabase's client roles, created for the test when the cluster has none."""
    admin = db.connect()
    created = []
    for name in client_role_names:
        if admin.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", (name,)).fetchone()[0] == 0:
            admin.execute(f'CREATE ROLE "{name}" NOLOGIN')
            created.append(name)
    yield client_role_names
    for name in created:
        admin.execute(f'DROP ROLE "{name}"')


def test_nobody_but_the_owner_may_call_them_and_they_run_with_the_callers_rights(db, client_roles):
    admin = db.connect()
    for signature in ENTRY_POINTS:
        for grantee in ("public", *client_roles):
            assert admin.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE')", (grantee, signature)).fetchone()[0] is False
        definer, config = admin.execute("SELECT prosecdef, proconfig FROM pg_proc WHERE oid = %s::regprocedure",
                                        (signature,)).fetchone()
        assert definer is False and config == ["search_path=\"\""]


def test_the_migration_revokes_them_from_client_roles_that_exist(db, client_roles):
    from pgflow_cli import installer

    admin = db.connect()
    for signature in ENTRY_POINTS:
        admin.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO anon, authenticated")
    stage = next(m for m in installer.available_migrations() if m.version == 3)
    admin.execute(stage.section("grants"))  # the migration's grant block
    for signature in ENTRY_POINTS:
        for grantee in client_roles:
            assert admin.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE')", (grantee, signature)).fetchone()[0] is False


def test_the_documented_trusted_role_completes_and_fails_manual_tasks(db, author, rt):
    author(Flow("trusted").step("gate", manual=True).step("other", lambda i, c: i)
           .step("after", lambda i, c: i, depends_on=["gate"]))
    admin = db.connect()
    role = _role(admin, "approver")
    admin.execute(TRUSTED_GRANTS.format(role=f'"{role}"'))  # after the flow's queue exists (ON ALL TABLES)
    admin.execute(f'GRANT {ensure_group(admin, "pgflow_trusted")} TO "{role}"')  # the caller check
    ok, bad = rt.start("trusted", {}), rt.start("trusted", {})
    with psycopg.connect(f"{db.conninfo} user={role}") as service:  # one transaction, committed at exit
        service.execute("SELECT pgflow.complete_manual_task(%s, 'gate', 0, %s)", (ok, Jsonb({"by": "service"})))
        service.execute("SELECT pgflow.fail_manual_task(%s, 'gate', 0, 'rejected')", (bad,))
    assert rt.task(ok, "after")["status"] == "queued"  # the next step's message was sent as the role
    assert rt.run(bad)["status"] == "failed" and rt.task(bad, "other")["status"] == "cancelled"


def test_execute_on_the_entry_points_alone_is_not_enough(db, author, rt):
    admin = db.connect()
    role = _role(admin, "bare")
    admin.execute(f'GRANT USAGE ON SCHEMA pgflow TO "{role}"')
    for signature in ENTRY_POINTS:
        admin.execute(f'GRANT EXECUTE ON FUNCTION {signature} TO "{role}"')
    author(Flow("bare").step("gate", manual=True))
    run = rt.start("bare", {})
    with psycopg.connect(f"{db.conninfo} user={role}", autocommit=True) as service:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            service.execute("SELECT pgflow.complete_manual_task(%s, 'gate', 0, '1')", (run,))
    assert rt.task(run, "gate")["status"] == "started"


def test_the_manual_paths_never_call_pgmq_themselves(rt):
    names = ("complete_manual_task", "fail_manual_task", "_lock_manual_task", "_complete_started_tasks",
             "_write_task_completions", "_fail_started_task", "_start_manual_tasks")
    sources = {r["proname"]: r["prosrc"] for r in rt.rows(
        "SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = 'pgflow' AND p.proname = ANY (%s)", (list(names),))}
    assert sorted(sources) == sorted(names)
    assert [name for name, src in sources.items() if "pgmq." in src] == []


def test_the_doc_lists_exactly_these_grants():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "permissions.md").read_text(encoding="utf-8")
    for line in TRUSTED_GRANTS.strip().splitlines():
        assert line.format(role="pgflow_trusted") in doc, line


def test_an_upgrade_keeps_an_existing_worker_role_working(baseline_db, client_role_names):
    """A role granted every pgflow function before the upgrade (docs/permissions.md worker recipe)
    can still call everything the worker paths reach afterwards: the stage's grant block hands it
    the internal functions complete_task/fail_task/start_ready_steps/compilation now call and the
    step-queue provisioning. Only the manual entry points and their lock stay out of reach.
    ``client_role_names`` holds the server-wide lock of the tests that create and drop ``anon``
    and ``authenticated``: the upgrade's grant blocks name every role, and one dropped by another
    test between the catalog read and the GRANT/REVOKE would fail it."""
    from pgflow_cli import installer

    admin = baseline_db.connect()
    admin.autocommit = True
    role = _role(admin, "upgraded_worker")
    admin.execute(f'GRANT USAGE ON SCHEMA pgflow TO "{role}"; GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgflow TO "{role}"')
    installer.apply(admin)
    unreachable = admin.execute(
        "SELECT coalesce(array_agg(p.oid::regprocedure::text ORDER BY p.oid::regprocedure::text), '{}') FROM pg_proc AS p "
        "JOIN pg_namespace AS n ON n.oid = p.pronamespace "
        "WHERE n.nspname = 'pgflow' AND p.prorettype <> 'trigger'::regtype AND NOT has_function_privilege(%s, p.oid, 'EXECUTE')",
        (role,)).fetchone()[0]
    # operator-only functions of the fence, whole-flow deletion and the run operations are never handed to
    # worker roles either (docs/permissions.md); the manual entry points are what this test is about
    operator_only = ("pgflow.fence_", "pgflow._fence", "pgflow.drop_flow", "pgflow._drop_flow",
                     "pgflow._require_flow", "pgflow._lock_flow_for_deletion", "pgflow._delete_flow_rows",
                     "pgflow.cancel_run", "pgflow.retry_run", "pgflow.resume_run",
                     "pgflow._lock_restart_source",
                     "pgflow._require_caller",  # the caller check: only operator and trusted calls reach it
                     "pgflow.prune_")  # pgflow prune, an operator command
    # sorted in Python too: the expected list is in code-point order, whatever the database's collation
    unreachable = sorted(f for f in unreachable if not f.startswith(operator_only))
    assert unreachable == ["pgflow._lock_manual_task(text,uuid,text,integer,text,jsonb,text)",
                           "pgflow.complete_manual_task(uuid,text,integer,jsonb)",
                           "pgflow.fail_manual_task(uuid,text,integer,text)"]

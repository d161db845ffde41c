"""Grants of the queue stage (0003's grant block): a role that can run a baseline entry point gets what
the stage's version of that call reaches (the batch entry points and their cores included), never
PUBLIC, anon or authenticated; and the block gives exactly what the earlier build's fourteen
migrations gave, role by role."""

from __future__ import annotations

import uuid

import pytest

from pgflow_cli import installer
from tests.support import old_levels

NEW = {
    "pgflow.complete_tasks(jsonb)": "pgflow.complete_task(uuid, text, integer, jsonb)",
    "pgflow._complete_started_tasks(uuid[], text[], integer[], jsonb[], text)": "pgflow.complete_task(uuid, text, integer, jsonb)",
    "pgflow._write_task_completions(uuid[], text[], integer[], jsonb[], text)": "pgflow.complete_task(uuid, text, integer, jsonb)",
    "pgflow._lock_worker_task(text, uuid, text, integer)": "pgflow.complete_task(uuid, text, integer, jsonb)",
    "pgflow.fail_tasks(jsonb)": "pgflow.fail_task(uuid, text, integer, text)",
    "pgflow.fail_task(uuid, text, integer, text, double precision, boolean)": "pgflow.fail_task(uuid, text, integer, text)",
    "pgflow._fail_started_task(uuid, text, integer, text, boolean, jsonb)": "pgflow.fail_task(uuid, text, integer, text)",
    "pgflow._task_report_elements(text, jsonb, text)": "pgflow.fail_task(uuid, text, integer, text)",
    "pgflow.start_flows(text, jsonb)": "pgflow.start_flow(text, jsonb, uuid)",
    "pgflow._start_runs(text, text, jsonb, uuid, uuid, text)": "pgflow.start_flow(text, jsonb, uuid)",
}


def _can(conn, role: str, signature: str) -> bool:
    return conn.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE')", (role, signature)).fetchone()[0]


def _grants_block() -> str:
    return next(m for m in installer.available_migrations() if m.version == 3).section("grants")


def test_the_grants_follow_the_calls_they_extend_and_skip_client_roles(db, client_role_names):
    admin = db.connect()
    suffix = uuid.uuid4().hex[:8]
    reporter, starter = f"reporter_{suffix}", f"starter_{suffix}"
    created = [reporter, starter]
    for name in client_role_names:
        if admin.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", (name,)).fetchone()[0] == 0:
            created.append(name)
    try:
        for role in created:
            admin.execute(f'CREATE ROLE "{role}" NOLOGIN')
        for signature in NEW:
            admin.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
        admin.execute(f'GRANT EXECUTE ON FUNCTION pgflow.complete_task(uuid, text, integer, jsonb), '
                      f'pgflow.fail_task(uuid, text, integer, text) TO "{reporter}", anon, authenticated')
        admin.execute(f'GRANT EXECUTE ON FUNCTION pgflow.start_flow(text, jsonb, uuid) TO "{starter}", anon')
        for signature in NEW:  # a client role that held them anyway loses them
            admin.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO authenticated")
        admin.execute(_grants_block())

        for signature, anchor in NEW.items():
            assert _can(admin, reporter, signature) is (anchor != "pgflow.start_flow(text, jsonb, uuid)"), signature
            assert _can(admin, starter, signature) is (anchor == "pgflow.start_flow(text, jsonb, uuid)"), signature
            for grantee in ("public", "anon", "authenticated"):
                assert _can(admin, grantee, signature) is False, (grantee, signature)
    finally:
        for role in created:
            admin.execute(f'DROP OWNED BY "{role}"')
            admin.execute(f'DROP ROLE "{role}"')


def test_a_fresh_install_grants_the_new_functions_to_nobody(db):
    admin = db.connect()
    for signature in NEW:
        assert _can(admin, "public", signature) is False, signature
        definer, config = admin.execute("SELECT prosecdef, proconfig FROM pg_proc WHERE oid = %s::regprocedure",
                                        (signature,)).fetchone()
        # a set-based core also plans its statements once and by key (_write_task_completions)
        assert definer is False and config[0] == "search_path=\"\"", signature


ROLES = {
    # role -> what it may run at the baseline (besides USAGE on the schema)
    "worker": "ALL FUNCTIONS IN SCHEMA pgflow",
    "producer": "FUNCTION pgflow.start_flow(text, jsonb, uuid), pgflow.start_ready_steps(uuid)",
    "reporter": "FUNCTION pgflow.complete_task(uuid, text, integer, jsonb), pgflow.fail_task(uuid, text, integer, text)",
    "compiler": "FUNCTION pgflow.ensure_flow_compiled(text, jsonb)",
    "claimer": "FUNCTION pgflow.start_tasks(text, bigint[], uuid)",
    "registrar": "FUNCTION pgflow.register_worker(uuid, text, text, text, text), pgflow.send_heartbeat(uuid)",
}
RENAMED = {
    # the earlier build's internal functions of completion and failure -> this build's (one completion
    # core, one failure core, the worker report's lock and the batch reports' helpers)
    "pgflow._complete_task_progress(uuid,text,integer,jsonb)": (
        "pgflow._complete_started_tasks(uuid[],text[],integer[],jsonb[],text)",
        "pgflow._write_task_completions(uuid[],text[],integer[],jsonb[],text)",
        "pgflow._fail_started_task(uuid,text,integer,text,boolean,jsonb)"),
    "pgflow._complete_worker_progress(uuid,text,integer,jsonb)": (
        "pgflow._complete_started_tasks(uuid[],text[],integer[],jsonb[],text)",),
    "pgflow._complete_worker_task(uuid,text,integer,jsonb)": ("pgflow._lock_worker_task(text,uuid,text,integer)",),
    "pgflow._complete_worker_tasks(uuid[],text[],integer[],jsonb[])": (
        "pgflow._complete_started_tasks(uuid[],text[],integer[],jsonb[],text)",),
    "pgflow._fail_task_exhausted(uuid,text,integer,text)": ("pgflow._fail_started_task(uuid,text,integer,text,boolean,jsonb)",),
    "pgflow._refuse_worker_report_of_manual_task(text,pgflow.step_tasks)": (
        "pgflow._lock_worker_task(text,uuid,text,integer)",),
    "pgflow.complete_tasks(jsonb)": ("pgflow.complete_tasks(jsonb)", "pgflow._task_report_elements(text,jsonb,text)",
                                     "pgflow._raise_task_report_error(text,integer,text,text,text,text)"),
    "pgflow.fail_tasks(jsonb)": ("pgflow.fail_tasks(jsonb)", "pgflow._task_report_elements(text,jsonb,text)",
                                 "pgflow._raise_task_report_error(text,integer,text,text,text,text)"),
    # the start core gained the restart lineage (retry_run, resume_run)
    "pgflow._start_runs(text,text,jsonb,uuid)": ("pgflow._start_runs(text,text,jsonb,uuid,uuid,text)",),
    # the failure with a retry delay or fail-now, which the earlier build did not have
    "pgflow.fail_task(uuid,text,integer,text)": ("pgflow.fail_task(uuid,text,integer,text)",
                                                 "pgflow.fail_task(uuid,text,integer,text,double precision,boolean)"),
    # the caller check the operator and trusted entry points make first (pgflow._require_caller)
    "pgflow.delete_flow_and_data(text)": ("pgflow.delete_flow_and_data(text)", "pgflow._require_caller(text,text)"),
}
"""What the earlier build's functions became here: a role that could run one can run these."""


def _renamed(executable: list[str]) -> list[str]:
    """The functions of the earlier build's list, named as this build names them."""
    return sorted({new for old in executable for new in RENAMED.get(old, (old,))})


EXECUTABLE = """
SELECT p.oid::regprocedure::text FROM pg_proc AS p
WHERE p.pronamespace = 'pgflow'::regnamespace AND has_function_privilege(%s, p.oid, 'EXECUTE')
ORDER BY 1
"""


@pytest.fixture
def stage_roles(harness, client_role_names):
    """A role per kind of baseline grant (:data:`ROLES`), named for this test; the test drops what they own."""
    suffix = uuid.uuid4().hex[:8]
    names = {kind: f"{kind}_{suffix}" for kind in ROLES}
    for name in names.values():
        harness.admin.execute(f'CREATE ROLE "{name}" NOLOGIN')
    yield names
    for name in names.values():
        harness.admin.execute(f'DROP ROLE "{name}"')


def test_the_grant_block_gives_each_role_what_the_earlier_builds_fourteen_migrations_gave(
        harness, request, stage_roles):
    """Level 2 of the earlier build's fixture, the same baseline grants in two databases; then its
    migrations 0003-0016 in one (as its `migrate apply` ran them) and this build's 0003 in the other."""
    template = harness.template("old_level_2", lambda conninfo: old_levels.build_level(conninfo, 2))
    databases = [harness.clone(template, "grants_old"), harness.clone(template, "grants_new")]
    try:
        for database in databases:
            with database.connect() as conn:
                for kind, name in stage_roles.items():
                    conn.execute(f'GRANT USAGE ON SCHEMA pgflow TO "{name}"')
                    conn.execute(f'GRANT EXECUTE ON {ROLES[kind]} TO "{name}"')
        old, new = databases
        old_levels.psql(old.conninfo, old_levels.level_script(16, after=2))
        with new.connect() as conn:
            [stage] = installer.apply(conn)
            assert stage.migration.version == 3
        with old.connect() as before, new.connect() as after:
            for kind, name in stage_roles.items():
                expected = _renamed([r[0] for r in before.execute(EXECUTABLE, (name,))])
                assert sorted(r[0] for r in after.execute(EXECUTABLE, (name,))) == expected, kind
                assert len(expected) > (1 if kind != "worker" else 60), kind
    finally:
        for database in databases:
            with database.connect() as conn:
                for name in stage_roles.values():
                    conn.execute(f'DROP OWNED BY "{name}"')
            harness.drop(database)

"""Grants of migration 0010: the batch entry points and their cores go exactly to the roles that could
run the call they extend (complete_task, fail_task, start_flow), never to PUBLIC, anon or authenticated."""

from __future__ import annotations

import uuid

from pgflow_cli import sqlfiles

NEW = {
    "pgflow.complete_tasks(jsonb)": "pgflow.complete_task(uuid, text, integer, jsonb)",
    "pgflow._complete_worker_task(uuid, text, integer, jsonb)": "pgflow.complete_task(uuid, text, integer, jsonb)",
    "pgflow.fail_tasks(jsonb)": "pgflow.fail_task(uuid, text, integer, text)",
    "pgflow.start_flows(text, jsonb)": "pgflow.start_flow(text, jsonb, uuid)",
    "pgflow._start_runs(text, text, jsonb, uuid)": "pgflow.start_flow(text, jsonb, uuid)",
}


def _can(conn, role: str, signature: str) -> bool:
    return conn.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE')", (role, signature)).fetchone()[0]


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
        text = sqlfiles.load("migrations/0010_throughput.sql")
        admin.execute(text[text.index("DO $grants$"):])  # the migration's grant statement

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
        assert definer is False and config == ["search_path=\"\""], signature

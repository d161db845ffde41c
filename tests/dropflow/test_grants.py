"""Who may drop a flow: the owner of the pgflow tables, or a member of pgflow_operator that may also
drop the queue tables (docs/drop-flow.md "Who may drop a flow"). EXECUTE alone is not enough: the
worker recipe grants EXECUTE on every pgflow function."""

from __future__ import annotations

import uuid

import psycopg

from tests.dropflow.helpers import assert_gone, drop
from tests.permissions.test_worker_role import ROLE_GRANTS
from tests.runtime.driver import raises_sqlstate

OPERATOR_GRANTS = """
GRANT USAGE ON SCHEMA pgflow, pgmq TO pgflow_operator;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgflow TO pgflow_operator;
GRANT SELECT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgflow TO pgflow_operator;
GRANT SELECT, DELETE ON pgmq.meta TO pgflow_operator;
"""
"""The operator recipe of docs/drop-flow.md, verbatim (test_the_doc_lists_these_grants keeps them in step)."""


def _login(admin, prefix: str) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin.execute(f'CREATE ROLE "{name}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE')
    return name


def _as(db, role: str) -> psycopg.Connection:
    conn = psycopg.connect(f"{db.conninfo} user={role}", autocommit=True)
    db._connections.append(conn)
    return conn


def test_only_the_owner_or_an_operator_may_drop(rt, db):
    admin = rt.conn
    admin.execute("DO $$ BEGIN CREATE ROLE pgflow_operator NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    deployer = _login(admin, "deployer")  # deploys flows: its startup compilation creates (owns) the queue tables
    worker = _login(admin, "worker")
    alice = _login(admin, "alice")
    for role in (deployer, worker):
        admin.execute(ROLE_GRANTS.format(role=f'"{role}"'))
    admin.execute(OPERATOR_GRANTS)
    admin.execute(f'GRANT pgflow_operator TO "{alice}"')
    _as(db, deployer).execute("SELECT pgflow.create_flow('retired'), pgflow.add_step('retired', 'a')")
    rt.start("retired", {"secret": "s3cr3t"})
    assert rt.val("SELECT tableowner FROM pg_tables WHERE schemaname = 'pgmq' AND tablename = 'q_retired'") == deployer

    # nothing for PUBLIC
    for fn in ("pgflow.drop_flow(text, boolean)", "pgflow.drop_flow_plan(text)", "pgflow._lock_flow_for_deletion(text)"):
        assert rt.val("SELECT has_function_privilege('public', %s, 'EXECUTE')", (fn,)) is False, fn
    # a worker has EXECUTE on everything, and still may not
    with raises_sqlstate("42501", f'role "{worker}" may not drop flows'):
        drop(rt, "retired", force=True, conn=_as(db, worker))
    # an operator who may not drop the queue tables is told whose right that is
    with raises_sqlstate("42501", f'queue "retired" \\(tables owned by "{deployer}"\\)'):
        drop(rt, "retired", force=True, conn=_as(db, alice))
    assert rt.val("SELECT count(*) FROM pgflow.runs") == 1

    admin.execute(f'GRANT "{deployer}" TO pgflow_operator')
    result = drop(rt, "retired", force=True, conn=_as(db, alice))
    assert result["deleted"]["runs"] == 1 and result["queues"][0]["outcome"] == "dropped"
    assert_gone(rt, "retired", ["retired"])


def test_the_doc_lists_these_grants():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "drop-flow.md").read_text(encoding="utf-8")
    for line in OPERATOR_GRANTS.strip().splitlines():
        assert line in doc, line

"""``migrate apply --sql`` piped into psql from the baseline, with a worker role and Supabase's client
roles present, ends where ``migrate apply`` ends: the same schema, the same function texts, the
same privileges."""

from __future__ import annotations

import uuid

import pytest

from pgflow_cli import installer
from pgflow_cli.errors import ExitCode
from tests.conftest import _install
from tests.output.test_sql_script import LEDGER, _psql
from tests.support.cli import run_cli
from tests.support.fingerprint import _dump

FUNCTIONS = """
SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid) FROM pg_proc AS p
WHERE p.pronamespace = 'pgflow'::regnamespace ORDER BY 1
"""

PRIVILEGES = """
-- (a function's NULL acl is the default: PUBLIC may execute it)
SELECT 'function', p.oid::regprocedure::text, coalesce(p.proacl::text, '') FROM pg_proc AS p
WHERE p.pronamespace = 'pgflow'::regnamespace
UNION ALL
SELECT 'relation', c.oid::regclass::text, coalesce(c.relacl::text, '') FROM pg_class AS c
WHERE c.relnamespace IN ('pgflow'::regnamespace, 'pgmq'::regnamespace)
UNION ALL
SELECT 'schema', n.nspname, coalesce(n.nspacl::text, '') FROM pg_namespace AS n WHERE n.nspname IN ('pgflow', 'pgmq')
ORDER BY 1, 2
"""


def _granted_to(rows, keep: set[str]) -> list[tuple[str, str, str]]:
    """``PRIVILEGES`` rows with only the ACL entries whose grantee is in ``keep`` or PUBLIC (an empty
    grantee). Roles are cluster-wide: a role another test creates meanwhile (and adds to a group that
    holds grants here) is granted by whichever of the two applies runs after it, so only the roles
    this test controls are compared."""
    kept = []
    for kind, name, acl in rows:
        entries = [e for e in acl.strip("{}").split(",") if e] if acl else []
        ours = [e for e in entries if e.split("=", 1)[0].strip('"') in keep or e.startswith("=")]
        kept.append((kind, name, "{" + ",".join(ours) + "}" if acl else ""))
    return kept


@pytest.fixture
def roles(harness, client_role_names):
    """A worker role, and Supabase's client roles where the cluster has none; the test drops what
    they own in its databases (``_release``), this fixture drops the roles it created."""
    admin = harness.admin
    created = [name for name in client_role_names
               if admin.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", (name,)).fetchone()[0] == 0]
    worker = f"script_worker_{uuid.uuid4().hex[:8]}"
    for name in (*created, worker):
        admin.execute(f'CREATE ROLE "{name}" NOLOGIN')
    yield worker, (worker, *client_role_names)
    for name in (worker, *created):
        admin.execute(f'DROP ROLE "{name}"')


def _release(databases, names) -> None:
    for database in databases:
        with database.connect() as conn:
            for name in names:
                conn.execute(f'DROP OWNED BY "{name}"')
            conn.commit()


def test_the_script_from_the_baseline_with_roles_gives_what_apply_gives(harness, baseline_db, roles):
    worker, names = roles
    by_apply = baseline_db
    by_psql = harness.clone(harness.template("baseline", lambda c: _install(c, installer.BASELINE_VERSION)), "script_lvl")
    try:
        for database in (by_apply, by_psql):
            conn = database.connect()
            conn.autocommit = True
            conn.execute(f'GRANT USAGE ON SCHEMA pgflow TO "{worker}"')
            conn.execute(f'GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgflow TO "{worker}"')
        script = run_cli("migrate", "apply", "--sql", "--dsn", by_psql.conninfo)
        assert script.code == ExitCode.OK, script.output
        ran = _psql(by_psql.conninfo, script.stdout)
        assert ran.returncode == 0, ran.stderr[-3000:]
        applied = run_cli("migrate", "apply", "--dsn", by_apply.conninfo)
        assert applied.code == ExitCode.OK, applied.output
        a, p = by_apply.connect(), by_psql.connect()
        assert _dump(by_psql.conninfo, "--schema-only") == _dump(by_apply.conninfo, "--schema-only")
        assert p.execute(FUNCTIONS).fetchall() == a.execute(FUNCTIONS).fetchall()
        privileges = p.execute(PRIVILEGES).fetchall()
        keep = {*names, p.execute("SELECT current_user").fetchone()[0]}
        assert _granted_to(privileges, keep) == _granted_to(a.execute(PRIVILEGES).fetchall(), keep)
        assert [r for r in privileges if f"{worker}=X" in r[2]], "the worker role lost its grants"
        leaked = [r for r in privileges if any(f"{who}=" in r[2] for who in ("anon", "authenticated"))
                  or r[2].startswith("{=") or ",=" in r[2] or (r[0] == "function" and r[2] == "")]
        assert leaked == []
        assert p.execute(LEDGER).fetchall() == a.execute(LEDGER).fetchall()
        assert installer.make_plan(p).pending == []
    finally:
        _release((by_apply, by_psql), names)
        harness.drop(by_psql)

"""Three roles, disjoint where it matters (docs/permissions.md "Three roles"): each recipe applied
verbatim from the doc; per role, every guarded entry point it must not call is refused with 42501
and nothing changes, and what it must do works; nothing is granted to PUBLIC, anon or authenticated.
The guarded functions come from the one list (pgflow_cli.permissions.GUARDED), which is checked
against the function files."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_cli import permissions, sqlfiles
from pgflow_cli.worker.flow import Flow
from tests.manual.conftest import author, rt  # noqa: F401 - the fixtures of the manual-task tests
from tests.runtime.driver import raises_sqlstate
from tests.support.roles import ensure_group

DOC = Path(__file__).resolve().parents[2] / "docs" / "permissions.md"
GROUPS_LOCK = 7310516
"""Advisory-lock key serialising the creation of the cluster-wide group roles."""

ARGUMENTS = {
    "pgflow.fence_disable(text[], text)": "ARRAY['payments-worker'], 'deploy'",
    "pgflow.fence_restore(text[])": "ARRAY['payments-worker']",
    "pgflow.drop_flow(text, boolean)": "'payments', true",
    "pgflow.delete_flow_and_data(text)": "'payments'",
    "pgflow.prune_runs(timestamp with time zone, uuid, integer, boolean)": "now() - interval '30 days', NULL, 100, false",
    "pgflow.prune_archive(text, timestamp with time zone, integer, boolean)": "'payments', now() - interval '30 days', 100, false",
    "pgflow.cancel_run(uuid, text)": "%(run)s, 'deploy'",
    "pgflow.retry_run(uuid)": "%(run)s",
    "pgflow.resume_run(uuid)": "%(run)s",
    "pgflow.complete_manual_task(uuid, text, integer, jsonb)": "%(run)s, 'approve', 0, '{\"ok\": true}'",
    "pgflow.fail_manual_task(uuid, text, integer, text)": "%(run)s, 'approve', 0, 'rejected'",
}
"""Arguments that would succeed for the owner: the refusal comes from the caller check alone."""


def test_every_guarded_function_is_listed_and_every_listed_one_checks_its_caller():
    calls = re.compile(r"pgflow\._require_caller\('(?P<role>[a-z_]+)'")
    found: dict[str, set[str]] = {}
    for path in (sqlfiles.sql_root() / "functions").rglob("*.sql"):
        for match in calls.finditer(path.read_text(encoding="utf-8")):
            found.setdefault(match["role"], set()).add(path.stem)
    listed = {role: {s.split("(")[0].removeprefix("pgflow.") for s in sigs} for role, sigs in permissions.GUARDED.items()}
    assert found == listed
    assert set(ARGUMENTS) == {s for sigs in permissions.GUARDED.values() for s in sigs}


def test_the_doc_shows_each_recipe_verbatim_and_lists_the_guarded_functions():
    doc = DOC.read_text(encoding="utf-8")
    for name, recipe in permissions.RECIPES.items():
        assert f"```sql\n{recipe}```" in doc, name
    for signature in (s for sigs in permissions.GUARDED.values() for s in sigs):
        assert f"`{signature.split('(')[0]}`" in doc, signature


def _apply(admin: psycopg.Connection, recipe: str, suffix: str) -> dict[str, str]:
    """Run ``recipe`` as the doc shows it, with its login roles renamed for this test (the group roles
    are cluster-wide and keep their names: the caller check asks for them by name); returns
    {doc name: role}."""
    renamed = {}
    for statement in (s.strip() for s in recipe.split(";\n") if s.strip()):
        group = re.fullmatch(r"CREATE ROLE (pgflow_operator|pgflow_trusted) NOLOGIN;?", statement)
        if group:
            ensure_group(admin, group[1])
            continue
        login = re.match(r"CREATE ROLE ([a-z_]+) LOGIN", statement)
        if login:
            renamed[login[1]] = f"{login[1]}_{suffix}"
        for name, role in renamed.items():
            statement = re.sub(rf"\b{name}\b", f'"{role}"', statement)
        admin.execute(statement.replace("PASSWORD '...'", "").rstrip(";"))
    return renamed


@pytest.fixture
def world(db, rt, author):
    """Flow ``payments`` with a waiting manual approval, its worker function tracked, and one login
    role per recipe; yields (admin, {recipe: role}, run id)."""
    admin = db.connect()
    author(Flow("payments").step("approve", manual=True).step("ship", lambda i, c: i, depends_on=["approve"]))
    admin.execute("SELECT pgflow.track_worker_function('payments-worker')")
    run = rt.start("payments", {"card": "4111-secret"})
    suffix = uuid.uuid4().hex[:8]
    roles = {}
    with psycopg.connect(db.conninfo.rsplit("dbname=", 1)[0] + "dbname=postgres", autocommit=True) as lock:
        lock.execute("SELECT pg_advisory_lock(%s)", (GROUPS_LOCK,))
        for name, recipe in permissions.RECIPES.items():
            roles[name] = next(iter(_apply(admin, recipe, suffix).values()))
    yield admin, roles, run
    for role in roles.values():
        admin.execute(f'DROP OWNED BY "{role}"')
        admin.execute(f'DROP ROLE "{role}"')


def _as(db, role: str) -> psycopg.Connection:
    conn = psycopg.connect(f"{db.conninfo} user={role}", autocommit=True)
    db._connections.append(conn)
    return conn


def _state(admin) -> tuple:
    return (admin.execute("SELECT run_id, step_slug, status FROM pgflow.step_tasks ORDER BY 1, 2").fetchall(),
            admin.execute("SELECT function_name, enabled FROM pgflow.worker_functions ORDER BY 1").fetchall(),
            admin.execute("SELECT count(*) FROM pgflow.fences").fetchone(),
            admin.execute("SELECT flow_slug FROM pgflow.flows ORDER BY 1").fetchall())


REFUSED = {
    "worker": [s for sigs in permissions.GUARDED.values() for s in sigs],
    "trusted": list(permissions.GUARDED[permissions.OPERATOR]),
    "operator": [],
}
"""What each recipe's role must not call."""


@pytest.mark.parametrize("recipe", sorted(REFUSED))
def test_each_role_is_refused_what_it_must_not_do_and_nothing_changes(db, world, recipe):
    admin, roles, run = world
    conn = _as(db, roles[recipe])
    before = _state(admin)
    for signature in REFUSED[recipe]:
        name = signature.split("(")[0]
        with raises_sqlstate("42501", f'role "{roles[recipe]}" may not'):
            conn.execute(f"SELECT {name}({ARGUMENTS[signature] % {'run': repr(str(run)) + '::uuid'}})")
    assert _state(admin) == before


def test_the_worker_role_cannot_finish_an_approval_fence_or_drop_but_reads_every_input(db, world):
    """The doc says why a worker can read every run's input: its claim reads the input with the
    caller's rights (SELECT on pgflow.runs), so no grant can narrow it to its routes."""
    admin, roles, run = world
    worker = _as(db, roles["worker"])
    assert worker.execute("SELECT input FROM pgflow.runs WHERE run_id = %s", (run,)).fetchone() == (
        {"card": "4111-secret"},)
    # the trusted role has no DELETE on the tables, the worker's recipe has
    trusted = _as(db, roles["trusted"])
    with raises_sqlstate("42501", "permission denied for table runs"):
        trusted.execute("DELETE FROM pgflow.runs")


def test_the_trusted_role_finishes_approvals_and_the_operator_fences_and_drops(db, world):
    admin, roles, run = world
    trusted = _as(db, roles["trusted"])
    [result] = trusted.execute("SELECT status FROM pgflow.complete_manual_task(%s, 'approve', 0, %s)",
                               (run, Jsonb({"ok": True}))).fetchall()
    assert result == ("completed",)
    assert admin.execute("SELECT status FROM pgflow.step_tasks WHERE run_id = %s AND step_slug = 'ship'",
                         (run,)).fetchone() == ("queued",)

    operator = _as(db, roles["operator"])
    fenced = operator.execute("SELECT action FROM pgflow.fence_disable(ARRAY['payments-worker'], 'deploy')").fetchall()
    assert fenced == [("fenced",)]
    assert operator.execute("SELECT outcome FROM pgflow.fence_restore(ARRAY['payments-worker'])").fetchall() == [
        ("restored",)]
    owner = admin.execute("SELECT tableowner FROM pg_tables WHERE schemaname = 'pgmq' AND tablename = 'q_payments'"
                          ).fetchone()[0]
    admin.execute(f'GRANT "{owner}" TO "{roles["operator"]}"')  # dropping a queue table is its owner's right
    dropped = operator.execute("SELECT pgflow.drop_flow('payments', true)").fetchone()[0]
    assert dropped["deleted"]["runs"] == 1


def test_nothing_is_granted_to_public_or_client_roles(db, client_role_names):
    admin = db.connect()
    signatures = ["pgflow._require_caller(text, text)"] + [s for sigs in permissions.GUARDED.values() for s in sigs]
    for signature in signatures:
        for grantee in ("public", *(r for r in client_role_names
                                    if admin.execute("SELECT to_regrole(%s)", (r,)).fetchone()[0])):
            assert admin.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE')",
                                 (grantee, signature)).fetchone()[0] is False, (grantee, signature)

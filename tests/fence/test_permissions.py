"""The fence operator role of docs/permissions.md: exactly its grants run disable, status and
restore; nothing of the fence is reachable by PUBLIC; a role without the grants gets exit 3."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

from tests.support.roles import ensure_group

DOC = Path(__file__).resolve().parents[2] / "docs" / "permissions.md"


def _operator_grants() -> str:
    """The ```sql block under "## `pgflow fence`: rollout operators" of docs/permissions.md."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## `pgflow fence`"):]
    return re.search(r"```sql\n(.*?)```", section, re.S).group(1)


def _role(fenv, prefix: str) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    fenv.conn.execute(f'CREATE ROLE "{name}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE')
    return name


def _as(fenv, role: str, *args: str):
    fenv.conninfo, saved = f"{fenv.db.conninfo} user={role}", fenv.conninfo
    try:
        return fenv.cli(*args)
    finally:
        fenv.conninfo = saved


def test_the_documented_operator_grants_are_enough(fenv):
    fenv.conn.execute("SELECT pgflow.track_worker_function('ops-fn')")
    role = _role(fenv, "fence_operator")
    grants = _operator_grants()
    assert "CREATE ROLE pgflow_fence_operator LOGIN IN ROLE pgflow_operator;" in grants
    fenv.conn.execute(grants.replace("CREATE ROLE pgflow_fence_operator LOGIN IN ROLE pgflow_operator;",
                                     f"GRANT {ensure_group(fenv.conn, 'pgflow_operator')} TO pgflow_fence_operator;")
                      .replace("pgflow_fence_operator", f'"{role}"'))

    disabled = _as(fenv, role, "disable", "--function", "ops-fn", "-m", "deploy", "--format", "json")
    assert disabled.code == 0, disabled.output
    status = _as(fenv, role, "status", "--format", "json")
    assert status.code == 0 and json.loads(status.stdout)["fences"][0]["fenced_by"] == role
    restored = _as(fenv, role, "restore", "--function", "ops-fn")
    assert restored.code == 0, restored.output
    assert fenv.enabled("ops-fn") is True


def test_without_the_grants_the_fence_is_refused_and_nothing_is_public(fenv):
    fenv.conn.execute("SELECT pgflow.track_worker_function('ops-fn')")
    role = _role(fenv, "nobody")
    fenv.conn.execute(f'GRANT USAGE ON SCHEMA pgflow TO "{role}"')
    result = _as(fenv, role, "disable", "--function", "ops-fn", "-m", "deploy")
    assert result.code == 3 and "permission denied" in result.stderr
    assert fenv.enabled("ops-fn") is True
    public = fenv.rows(
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = 'pgflow' AND (p.proname LIKE '%%fence%%' OR p.proname = '_count_enabled_change') "
        "AND has_function_privilege('public', p.oid, 'EXECUTE')")
    assert public == []
    assert fenv.val("SELECT has_table_privilege('public', 'pgflow.fences', 'SELECT')") is False

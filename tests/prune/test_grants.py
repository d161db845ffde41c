"""The operator recipe of docs/permissions.md ("`pgflow prune`"), run as written: a role with exactly
those grants prunes; without the function grants it is refused (exit 3) and nothing changes."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from psycopg.conninfo import make_conninfo

from pgflow_cli.errors import ExitCode
from tests.prune.helpers import build_history
from tests.support.cli import run_cli
from tests.support.roles import ensure_group

PERMISSIONS = Path(__file__).resolve().parents[2] / "docs" / "permissions.md"


def recipe() -> list[str]:
    text = PERMISSIONS.read_text()
    section = text.split("## `pgflow prune`", 1)[1]
    block = re.search(r"```sql\n(.*?)```", section, re.S).group(1)
    statement = " ".join(line for line in block.splitlines() if not line.lstrip().startswith("--"))
    return [s.strip() for s in statement.split(";") if s.strip()]


def test_the_operator_recipe_is_enough_to_prune(rt, db):
    history = build_history(rt)
    role = f"pruner_{uuid.uuid4().hex[:8]}"
    admin = db.connect()
    ensure_group(admin, "pgflow_operator")  # cluster-wide, shared with other tests: made once, never dropped
    try:
        for statement in recipe():
            admin.execute(statement.replace("pgflow_pruner", role).replace("CREATE ROLE " + role + " LOGIN",
                                                                            f"CREATE ROLE {role} LOGIN PASSWORD 'pw'"))
        dsn = make_conninfo(db.conninfo, user=role, password="pw")
        admin.execute(f"REVOKE EXECUTE ON FUNCTION pgflow.prune_runs(timestamptz, uuid, integer, boolean) FROM {role}")
        refused = run_cli("prune", "--older-than", "30d", "--yes", "--dsn", dsn)
        assert refused.code == ExitCode.CONNECTION, refused.output
        assert rt.val("SELECT count(*) FROM pgflow.runs WHERE run_id = ANY (%s)", (history.gone,)) == len(history.gone)
        admin.execute(f"GRANT EXECUTE ON FUNCTION pgflow.prune_runs(timestamptz, uuid, integer, boolean) TO {role}")
        result = run_cli("prune", "--older-than", "30d", "--yes", "--dsn", dsn)
        assert result.code == 0, result.output
        assert rt.val("SELECT count(*) FROM pgflow.runs WHERE run_id = ANY (%s)", (history.gone,)) == 0
    finally:
        admin.execute(f"DROP OWNED BY {role}")
        admin.execute(f"DROP ROLE {role}")
        admin.close()



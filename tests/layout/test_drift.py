"""`migrate status` reports a function whose installed definition differs from its file (no per-file
ledger: the catalog is compared with the file's body and options)."""

from __future__ import annotations

import json

from pgflow_cli import installer, sqlfiles
from pgflow_cli.errors import ExitCode
from pgflow_cli.installer.catalog import function_files, optional_function_files
from tests.support.cli import run_cli


def _states(conn) -> dict[str, str]:
    return {f.path: f.state for f in installer.make_plan(conn).files}


def test_a_fresh_install_has_every_function_file_current(db):
    with db.connect() as conn:
        states = _states(conn)
    expected = [p for p in function_files()
                if p not in optional_function_files() and "CREATE TYPE" not in sqlfiles.load(p)]
    assert sorted(states) == sorted(expected)
    assert set(states.values()) == {"current"}


def test_a_changed_body_other_options_and_a_dropped_function_are_drift(db):
    with db.connect() as conn:
        conn.execute("CREATE OR REPLACE FUNCTION pgflow.is_local() RETURNS boolean LANGUAGE sql STABLE "
                     "SET search_path = '' AS $$ SELECT true $$")
        conn.execute("ALTER FUNCTION pgflow.claim_tasks(text, bigint[], uuid, text, text) SECURITY DEFINER")
        conn.execute("DROP FUNCTION pgflow.drop_flow_plan(text)")
        states = _states(conn)
    assert states["functions/supabase/is_local.sql"] == "differs"
    assert states["functions/claim/claim_tasks.sql"] == "differs"
    assert states["functions/definitions/drop_flow_plan.sql"] == "missing"
    assert sum(state != "current" for state in states.values()) == 3

    result = run_cli("migrate", "status", "--format", "json", "--dsn", db.conninfo)
    assert result.code == ExitCode.FINDINGS, result.output
    doc = json.loads(result.stdout)
    assert doc["verdict"] == "drift"
    assert sorted(doc["file_drift"]) == ["functions/claim/claim_tasks.sql", "functions/definitions/drop_flow_plan.sql",
                                         "functions/supabase/is_local.sql"]
    claim = next(f for f in doc["files"] if f["path"] == "functions/claim/claim_tasks.sql")
    assert "security definer" in claim["detail"][0]
    text = run_cli("migrate", "status", "--dsn", db.conninfo)
    assert "sql/functions/supabase/is_local.sql" in text.stdout and text.code == ExitCode.FINDINGS


def test_drift_is_not_judged_while_a_migration_is_pending(baseline_db):
    with baseline_db.connect() as conn:
        plan = installer.make_plan(conn)
    assert plan.pending and plan.files == []

"""`pgflow migrate` beyond the happy upgrade: fresh installs, dry runs that must keep nothing, resumed
phased runs, and what the upgrade does to privileges operators granted."""

from __future__ import annotations

import json

from pgflow_cli import sqlfiles
from pgflow_cli.errors import ExitCode
from tests.support.cli import run_cli
from tests.support.fingerprint import fingerprint
from tests.support.levels import versions_after
from tests.upgrade.test_phased import _interrupt_main


def _ledger(conn) -> list[int]:
    if conn.execute("SELECT to_regclass('pgflow.schema_migrations')").fetchone()[0] is None:
        return []
    return [r[0] for r in conn.execute("SELECT version FROM pgflow.schema_migrations WHERE state = 'applied' ORDER BY 1")]


def test_migrate_apply_installs_a_fresh_database(empty_db):
    result = run_cli("migrate", "apply", "--install-pgmq", "--dsn", empty_db.conninfo)
    assert result.code == ExitCode.OK, result.output
    assert _ledger(empty_db.connect()) == [1, 2, 3, *versions_after(3)]


def test_migrate_plan_lists_a_fresh_install(empty_db):
    assert run_cli("migrate", "apply", "--target", "1", "--install-pgmq", "--dsn", empty_db.conninfo).code == 0
    empty_db.connect().execute("DROP SCHEMA pgflow CASCADE")  # PGMQ stays: a database ready for pgflow
    result = run_cli("migrate", "plan", "--format", "json", "--dsn", empty_db.conninfo)
    assert result.code == ExitCode.OK, result.output
    assert [m["version"] for m in json.loads(result.stdout)["pending"]] == [1, 2, 3, *versions_after(3)]


def test_dry_run_with_install_pgmq_changes_nothing(empty_db):
    conn = empty_db.connect()
    count = "SELECT count(*) FROM pg_namespace WHERE nspname IN ('pgmq', 'pgflow')"
    assert conn.execute(count).fetchone()[0] == 0
    run_cli("migrate", "apply", "--dry-run", "--install-pgmq", "--target", "1", "--dsn", empty_db.conninfo)
    assert conn.execute(count).fetchone()[0] == 0


def test_dry_run_of_an_in_progress_phased_migration(pre_upgrade_db):
    conn, blocker = _interrupt_main(pre_upgrade_db)
    blocker.rollback()
    blocker.close()
    before = fingerprint(pre_upgrade_db.conninfo)
    result = run_cli("migrate", "apply", "--dry-run", "--format", "json", "--dsn", pre_upgrade_db.conninfo)
    assert fingerprint(pre_upgrade_db.conninfo).differences(before) == []
    assert result.code in (ExitCode.OK, ExitCode.CONFLICT), result.output
    assert "database error" not in result.stderr


def test_upgrade_keeps_grants_on_the_installed_pruning_function(baseline_db):
    admin = baseline_db.connect()
    admin.execute(sqlfiles.load("optional/prune_baseline.sql"))
    role = f"brk_pruner_{baseline_db.name}"[:60]
    admin.execute(f'CREATE ROLE "{role}" NOLOGIN')
    try:
        admin.execute(f'GRANT EXECUTE ON FUNCTION pgflow.prune_data_older_than(interval) TO "{role}"')
        result = run_cli("migrate", "apply", "--dsn", baseline_db.conninfo)
        assert result.code == ExitCode.OK, result.output
        assert admin.execute("SELECT has_function_privilege(%s, 'pgflow.prune_data_older_than(interval)', 'EXECUTE')",
                             (role,)).fetchone()[0]
    finally:
        admin.execute(f'DROP OWNED BY "{role}"')
        admin.execute(f'DROP ROLE "{role}"')


def test_pre_upgrade_worker_grants_cover_the_protocol_2_entry_points(baseline_db):
    admin = baseline_db.connect()
    role = f"brk_worker_{baseline_db.name}"[:60]
    admin.execute(f'CREATE ROLE "{role}" NOLOGIN')
    try:
        admin.execute(f'GRANT USAGE ON SCHEMA pgflow TO "{role}"')
        admin.execute(f'GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgflow TO "{role}"')
        result = run_cli("migrate", "apply", "--dsn", baseline_db.conninfo)
        assert result.code == ExitCode.OK, result.output
        missing = [r[0] for r in admin.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc AS p "
            "WHERE p.oid IN ('pgflow.claim_tasks(text,bigint[],uuid,text,text)'::regprocedure, "
            "'pgflow.ensure_flow_compiled(text,jsonb,integer,text,jsonb)'::regprocedure) "
            "AND NOT has_function_privilege(%s, p.oid, 'EXECUTE')", (role,))]
        assert missing == []
    finally:
        admin.execute(f'DROP OWNED BY "{role}"')
        admin.execute(f'DROP ROLE "{role}"')


def test_abort_with_nothing_in_progress_and_unknown_versions_is_exit_6(db):
    """Guard: abort of an applied, a pending-less or a nonexistent version changes nothing and is exit 6."""
    before = fingerprint(db.conninfo)
    for version in ("3", "1", "9999"):
        result = run_cli("migrate", "abort", version, "--yes", "--dsn", db.conninfo)
        assert result.code == ExitCode.CONFLICT, result.output
        assert "not in progress" in result.stderr
    assert fingerprint(db.conninfo).differences(before) == []


def test_nothing_in_pgflow_is_granted_to_public_after_a_full_install(db):
    """Guard: after 0001-0003, PUBLIC has no USAGE on schema pgflow and no privilege on any pgflow table,
    sequence or function (DESIGN: 'nothing granted to PUBLIC')."""
    conn = db.connect()
    assert not conn.execute("SELECT has_schema_privilege('public', 'pgflow', 'USAGE')").fetchone()[0]
    leaks = conn.execute(
        """
        SELECT c.oid::regclass::text FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
        WHERE n.nspname = 'pgflow' AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
          AND (has_table_privilege('public', c.oid, 'SELECT,INSERT,UPDATE,DELETE,TRUNCATE,REFERENCES,TRIGGER')
               OR (c.relkind = 'S' AND has_sequence_privilege('public', c.oid, 'USAGE')))
        UNION ALL
        SELECT p.oid::regprocedure::text FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace
        WHERE n.nspname = 'pgflow' AND has_function_privilege('public', p.oid, 'EXECUTE')
        """).fetchall()
    assert leaks == []
    # SECURITY DEFINER functions pin their search_path (no hijacking through a caller's search_path)
    unpinned = conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace "
        "WHERE n.nspname = 'pgflow' AND p.prosecdef "
        "AND NOT coalesce(p.proconfig::text[] && ARRAY['search_path=\"\"', 'search_path=pg_catalog'], false)").fetchall()
    assert unpinned == []

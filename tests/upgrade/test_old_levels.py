"""Databases an earlier build left at the old levels of the queue stage (its migrations 0003-0016).

Built from that build's own SQL (tests/fixtures, tests/support/old_levels.py). A ledger holding all
of 0003-0016 is converted by ``migrate apply`` into the one migration ``0003_queue_stage`` after a
catalog comparison, and then equals a fresh install; every other set of them (a level between, a
phased run left in progress, an unknown checksum) is refused with exit 6 naming the build to
finish with, and nothing changes.
"""

from __future__ import annotations

import json
import re
import uuid

import psycopg
import pytest

from pgflow_cli import installer
from pgflow_cli.errors import ExitCode, StateConflict
from pgflow_cli.installer import old_levels
from pgflow_cli.installer.catalog import read_schema_facts
from tests.breaker.s4.test_sql_script_levels import PRIVILEGES
from tests.layout.catalog import definitions
from tests.output.test_sql_script import LEDGER
from tests.permissions.test_worker_role import ROLE_GRANTS
from tests.support import old_levels as fixture
from tests.support.cli import run_cli
from tests.support.fingerprint import _dump, fingerprint


def _level(harness, request, level: int):
    template = harness.template(f"old_level_{level}", lambda conninfo: fixture.build_level(conninfo, level))
    return harness.fresh(template, request)


@pytest.fixture
def level_16(harness, request):
    yield from _level(harness, request, 16)


FUNCTIONS = "SELECT oid::regprocedure::text FROM pg_proc WHERE pronamespace = 'pgflow'::regnamespace"
"""Every pgflow function by signature."""


def _catalog(conninfo: str) -> dict[str, object]:
    with psycopg.connect(conninfo) as conn:
        return {"definitions": definitions(conn), "schema": read_schema_facts(conn),
                "privileges": conn.execute(PRIVILEGES).fetchall(), "ledger": conn.execute(LEDGER).fetchall(),
                "dump": _dump(conninfo, "--schema-only")}


def _assert_same_catalog(conninfo: str, reference: str) -> None:
    mine, theirs = _catalog(conninfo), _catalog(reference)
    for part in ("definitions", "schema", "privileges", "ledger", "dump"):
        assert mine[part] == theirs[part], part


def test_the_frozen_schema_of_level_16_is_the_fixtures_and_what_0003_builds_but_its_additions(level_16, db):
    with level_16.connect() as conn:
        assert read_schema_facts(conn) == old_levels.LEVEL_16_SCHEMA
        functions = [r[0] for r in conn.execute("SELECT p.oid::regprocedure::text FROM pg_proc AS p "
                                                "WHERE p.pronamespace = 'pgflow'::regnamespace ORDER BY 1")]
        assert tuple(functions) == old_levels.LEVEL_16_FUNCTIONS
        assert {v: (n, c) for v, n, c in conn.execute(
            "SELECT version, name, checksum FROM pgflow.schema_migrations WHERE version >= 3")} == {
            v: (name, checksums[0]) for v, (name, checksums) in old_levels.OLD_MIGRATIONS.items()}
    with db.connect() as conn, conn.transaction(force_rollback=True):
        # what 0003 builds is level 16 and its additions (which the conversion adds): without them
        conn.execute(_dropping_the_additions())
        assert read_schema_facts(conn) == old_levels.LEVEL_16_SCHEMA


def _dropping_the_additions() -> str:
    """SQL that takes away what the ``additions`` section of 0003 adds: its columns (their
    constraints and indexes go with them), its tables and its indexes, and builds again (as level 16
    has them) the indexes it drops."""
    section = next(m for m in installer.available_migrations() if m.version == 3).section("additions")
    columns = re.findall(r"^ALTER TABLE (\S+) ADD COLUMN (?:IF NOT EXISTS )?(\w+)", section, re.MULTILINE)
    tables = re.findall(r"^CREATE TABLE (?:IF NOT EXISTS )?(\S+)", section, re.MULTILINE)
    indexes = re.findall(r"^CREATE INDEX (?:IF NOT EXISTS )?(\w+) ON (\w+)\.", section, re.MULTILINE)
    dropped = re.findall(r"^DROP INDEX (?:IF EXISTS )?\w+\.(\w+)", section, re.MULTILINE)
    assert columns and tables, "the additions section adds no column or no table any more: adapt this helper"
    return ";".join([f"DROP TABLE {table}" for table in tables]
                    + [f"ALTER TABLE {table} DROP COLUMN {column}" for table, column in columns]
                    + [f"DROP INDEX IF EXISTS {schema}.{name}" for name, schema in indexes]
                    + [old_levels.LEVEL_16_SCHEMA["index"][name] for name in dropped])


def test_level_16_is_converted_in_one_transaction_and_then_equals_a_fresh_install(level_16, db):
    status = run_cli("migrate", "status", "--format", "json", "--dsn", level_16.conninfo)
    assert status.code == ExitCode.OK, status.output
    doc = json.loads(status.stdout)
    assert doc["verdict"] == "pending" and doc["pending"] == [3]
    states = {(m["version"], m["name"]): m["state"] for m in doc["migrations"]}
    assert states[(3, "queue_stage")] == "pending" and states[(3, "queue_identity")] == "superseded"
    assert sum(state == "superseded" for state in states.values()) == 14
    plan = run_cli("migrate", "plan", "--dsn", level_16.conninfo)
    assert plan.code == ExitCode.OK and "conversion of 0003-0016 of pgflow-cli c6993b3" in plan.stdout
    assert "switches workers" not in plan.stdout  # the database speaks protocol 2 already

    before = fingerprint(level_16.conninfo)
    dry = run_cli("migrate", "apply", "--dry-run", "--dsn", level_16.conninfo)
    assert dry.code == ExitCode.OK, dry.output
    assert fingerprint(level_16.conninfo).differences(before) == []

    applied = run_cli("migrate", "apply", "--dsn", level_16.conninfo)
    assert applied.code == ExitCode.OK, applied.output
    assert "applied 0003_queue_stage" in applied.stderr and "preflight" not in applied.stderr
    _assert_same_catalog(level_16.conninfo, db.conninfo)
    with level_16.connect() as conn:
        assert conn.execute("SELECT to_regclass('pgflow.schema_migration_files')").fetchone()[0] is None
        assert installer.make_plan(conn).pending == []
    again = run_cli("migrate", "status", "--dsn", level_16.conninfo)
    assert again.code == ExitCode.OK and "up to date" in again.stdout


OPERATIONS_SINCE_LEVEL_16 = ("pgflow.cancel_run(uuid,text)", "pgflow.retry_run(uuid)", "pgflow.resume_run(uuid)",
                             "pgflow._lock_restart_source(text,uuid)")
"""Functions the stage gained after level 16 that a worker role must not be handed by the conversion
(the run operations: docs/permissions.md "Run operators")."""


def test_the_conversion_keeps_a_worker_roles_grants(harness, level_16, db, request):
    role = f"recipe_worker_{uuid.uuid4().hex[:8]}"
    harness.admin.execute(f'CREATE ROLE "{role}" NOLOGIN')
    try:
        for database in (level_16, db):  # the fresh install gets the recipe after it, level 16 before
            with database.connect() as conn:
                conn.execute(ROLE_GRANTS.format(role=f'"{role}"'))
        with level_16.connect() as conn:
            before = {row[0] for row in conn.execute(FUNCTIONS).fetchall()}
        applied = run_cli("migrate", "apply", "--dsn", level_16.conninfo)
        assert applied.code == ExitCode.OK, applied.output
        with level_16.connect() as conn:
            kept = {row[0] for row in conn.execute(FUNCTIONS).fetchall()} & before
            assert kept and not [f for f in kept if not conn.execute(
                "SELECT has_function_privilege(%s, %s::regprocedure, 'EXECUTE')", (role, f)).fetchone()[0]]
            # the run operations are not handed to a worker role by the conversion
            assert not [f for f in OPERATIONS_SINCE_LEVEL_16 if conn.execute(
                "SELECT has_function_privilege(%s, %s::regprocedure, 'EXECUTE')", (role, f)).fetchone()[0]]
        # a function the stage adds gets what the migration grants, not what "ALL FUNCTIONS" gave the
        # recipe at the fresh install: the role's grants on those are left out of the comparison
        for database in (level_16, db):
            with database.connect() as conn:
                for function in {row[0] for row in conn.execute(FUNCTIONS).fetchall()} - before:
                    conn.execute(f'REVOKE EXECUTE ON FUNCTION {function} FROM "{role}"')
        _assert_same_catalog(level_16.conninfo, db.conninfo)
    finally:
        for database in (level_16, db):
            with database.connect() as conn:
                conn.execute(f'DROP OWNED BY "{role}"')
        harness.admin.execute(f'DROP ROLE "{role}"')


def test_the_conversion_accepts_the_earlier_text_of_0009(level_16, db):
    [_, earlier] = old_levels.OLD_MIGRATIONS[9][1]
    with level_16.connect() as conn:
        conn.execute("UPDATE pgflow.schema_migrations SET checksum = %s WHERE version = 9", (earlier,))
    applied = run_cli("migrate", "apply", "--dsn", level_16.conninfo)
    assert applied.code == ExitCode.OK, applied.output
    _assert_same_catalog(level_16.conninfo, db.conninfo)


def _refused(database, *needles: str) -> None:
    """``status``, ``plan``, ``apply`` (and ``--dry-run``, ``--sql``) and ``abort`` all refuse with exit 6;
    nothing changes."""
    before = fingerprint(database.conninfo)
    for command in (("status",), ("plan",), ("apply",), ("apply", "--dry-run"), ("apply", "--sql"),
                    ("abort", "3", "--yes")):
        result = run_cli("migrate", *command, "--dsn", database.conninfo)
        assert result.code == ExitCode.CONFLICT, (command, result.output)
        text = " ".join(result.stderr.split())
        assert "Traceback" not in result.output
        for needle in needles:
            assert needle in text, (command, needle, text)
    assert fingerprint(database.conninfo).differences(before) == []


FINISH = ("pgflow-cli from commit c6993b3", "then run this tool's `pgflow migrate apply", "nothing was changed")


@pytest.mark.parametrize("level", range(3, 16))
def test_a_level_between_is_refused_naming_the_build_to_finish_with(level, harness, request):
    for database in _level(harness, request, level):
        _refused(database, *FINISH, f"the ledger records migrations 0003-{level:04d} of an earlier pgflow-cli build",
                 f"{level + 1:04d}" if level < 15 else "0016")


@pytest.mark.parametrize("label", sorted(fixture.IN_PROGRESS))
def test_a_phased_run_left_in_progress_is_refused(label, harness, request):
    template = harness.template(label.replace(" ", "_"), lambda conninfo: fixture.build_in_progress(conninfo, label))
    for database in harness.fresh(template, request):
        _refused(database, *FINISH, f"{label[:4]}_{old_levels.OLD_MIGRATIONS[int(label[:4])][0]} is in progress")


def test_an_unknown_checksum_is_refused(level_16):
    with level_16.connect() as conn:
        conn.execute("UPDATE pgflow.schema_migrations SET checksum = repeat('ab', 32) WHERE version = 12")
    _refused(level_16, *FINISH, "0012_claim_paths: checksum abababababab... is not one that build shipped")


def test_a_schema_changed_by_hand_is_refused_with_the_list_and_nothing_changes(level_16):
    with level_16.connect() as conn:
        conn.execute("ALTER TABLE pgflow.flows ADD COLUMN note text")
        conn.execute("DROP INDEX pgflow.idx_workers_function_name")
    before = fingerprint(level_16.conninfo)
    result = run_cli("migrate", "apply", "--dsn", level_16.conninfo)
    assert result.code == ExitCode.CONFLICT, result.output
    text = " ".join(result.stderr.split())
    assert "the schema differs from what they leave (2 difference(s)); nothing was changed" in text
    assert "missing index idx_workers_function_name" in text and "extra column flows.note" in text
    assert fingerprint(level_16.conninfo).differences(before) == []


def test_functions_of_level_16_the_stage_no_longer_creates_are_dropped(level_16, monkeypatch):
    """Run in-process: the frozen list gains a function only this database has, as it will when a
    function file is removed; a function of the schema that is not in the list is left alone."""
    with level_16.connect() as conn:
        conn.execute("CREATE FUNCTION pgflow._retired_helper() RETURNS integer LANGUAGE sql AS 'SELECT 1'")
        conn.execute("CREATE FUNCTION pgflow.operators_own() RETURNS integer LANGUAGE sql AS 'SELECT 2'")
    monkeypatch.setattr(old_levels, "LEVEL_16_FUNCTIONS", (*old_levels.LEVEL_16_FUNCTIONS, "pgflow._retired_helper()"))
    with level_16.connect() as conn:
        [applied] = installer.apply(conn)
        assert applied.migration.label == "0003_queue_stage"
        assert conn.execute("SELECT to_regprocedure('pgflow._retired_helper()')").fetchone()[0] is None
        assert conn.execute("SELECT pgflow.operators_own()").fetchone()[0] == 2


def test_a_converted_database_records_nothing_twice(level_16):
    with level_16.connect() as conn:
        installer.apply(conn)
        assert installer.apply(conn) == []
        plan = installer.make_plan(conn)
        assert [(s.version, s.state) for s in plan.statuses] == [(1, "applied"), (2, "applied"), (3, "applied")]
        assert plan.old is None and plan.refuse_reasons() is None


def test_the_refusal_is_a_state_conflict_in_the_plan(harness, request):
    for database in _level(harness, request, 9):
        with database.connect() as conn:
            plan = installer.make_plan(conn)
            conflict = plan.refuse_reasons()
            assert isinstance(conflict, StateConflict) and conflict.exit_code == ExitCode.CONFLICT
            assert plan.old is not None and plan.old.newest == 9 and plan.conversion is None
            assert plan.old.problems()[0].startswith("migrations 0010, 0011, 0012, 0013, 0014, 0015, 0016")
            with pytest.raises(StateConflict):
                installer.apply(conn)

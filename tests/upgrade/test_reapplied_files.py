"""A later migration may re-apply any function file (docs/architecture.md "Function files in a run").

In one run each ``--@apply`` file runs in full in the last pending migration that applies it; an
earlier pending migration that applies it runs only what the file creates there (a function or
trigger that does not exist yet), so the grants and triggers of that migration's own SQL find it.
Before that rule, 0014 (which re-applies four files 0010 creates and grants) made every upgrade
from below 0010 with a worker role fail in 0010's grant block ("function
pgflow._complete_worker_task(...) does not exist").

Levels 4-13 cannot be installed exactly by this tool (later migrations changed their files; the
installer refuses such a target): :func:`at_level` builds them as an older pgflow-cli left them,
each migration up to N with its once-only SQL, the function files in their current text. That
is level N's tables, grants and ledger, which is what the upgrade's migrations read.

Checked after each upgrade: it succeeded; a worker role granted by the docs/permissions.md recipe
before it reaches every function a worker path reaches; PUBLIC, ``anon`` and ``authenticated``
reach no pgflow function; every function has the text a fresh install gives; the ledger shows
every file current.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator, Sequence

import pytest

from pgflow_cli import installer, sqlfiles
from pgflow_cli.installer import runner
from pgflow_cli.installer.files import Migration

FUNCTIONS = """
SELECT p.oid::regprocedure::text, pg_catalog.pg_get_functiondef(p.oid)
FROM pg_catalog.pg_proc AS p
WHERE p.pronamespace = 'pgflow'::regnamespace AND p.prokind IN ('f', 'p')
ORDER BY 1
"""

UNREACHABLE = """
SELECT coalesce(pg_catalog.array_agg(p.oid::regprocedure::text ORDER BY p.oid::regprocedure::text), '{}')
FROM pg_catalog.pg_proc AS p
WHERE p.pronamespace = 'pgflow'::regnamespace AND p.prorettype <> 'trigger'::regtype
  AND NOT pg_catalog.has_function_privilege(%s, p.oid, 'EXECUTE')
"""

REACHABLE = """
SELECT coalesce(pg_catalog.array_agg(p.oid::regprocedure::text ORDER BY p.oid::regprocedure::text), '{}')
FROM pg_catalog.pg_proc AS p
WHERE p.pronamespace = 'pgflow'::regnamespace AND pg_catalog.has_function_privilege(%s, p.oid, 'EXECUTE')
"""

OPERATOR_ONLY = ("pgflow.fence_", "pgflow._fence", "pgflow.drop_flow", "pgflow._drop_flow",
                 "pgflow._require_flow", "pgflow._lock_flow_for_deletion", "pgflow._delete_flow_rows")
"""Operator functions (0007, 0008) a worker role is never handed (docs/permissions.md)."""

MANUAL_ONLY = ["pgflow._lock_manual_task(text,uuid,text,integer,text,jsonb,text)",
               "pgflow.complete_manual_task(uuid,text,integer,jsonb)",
               "pgflow.fail_manual_task(uuid,text,integer,text)"]
"""The manual entry points: a trusted role on purpose, never a worker role (docs/manual-tasks.md)."""


def _every_level() -> list[int]:
    """The baseline and every later level, the newest included."""
    return [m.version for m in installer.available_migrations() if m.version >= installer.BASELINE_VERSION]


def older_tool_file_runs(migrations: Sequence[Migration], todo: Sequence[Migration]) -> dict[int, frozenset[str]]:
    """:func:`installer.file_runs` of an older pgflow-cli run that stopped at ``todo[-1]`` when it
    was the newest migration: each file in the last migration of ``todo`` that applies it, no
    refusal of the target (that tool shipped the level's texts)."""
    last = {a.path: m.version for m in todo for a in m.applies}
    return {m.version: frozenset(a.path for a in m.applies if last[a.path] != m.version) for m in todo}


def at_level(conn, level: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bring a database at the baseline (level 2) to ``level`` as an older tool left it (see the
    module doc). The current texts may name columns of later levels, which the older tool's texts
    did not: their bodies are not checked while the level is built."""
    with monkeypatch.context() as patch:
        if level > 3:
            patch.setattr(runner, "file_runs", older_tool_file_runs)
        conn.execute("SET check_function_bodies = off")
        installer.apply(conn, target=level)
        conn.execute("RESET check_function_bodies")
    assert max(s.version for s in installer.make_plan(conn).statuses if s.state == "applied") == level


@pytest.fixture
def roles(baseline_db, client_role_names) -> Iterator[tuple[str, tuple[str, ...]]]:
    """A worker role for this database and Supabase's client roles (created when the cluster has none)."""
    admin = baseline_db.connect()
    admin.autocommit = True
    created = []
    for name in client_role_names:
        if admin.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", (name,)).fetchone()[0] == 0:
            admin.execute(f'CREATE ROLE "{name}" NOLOGIN')
            created.append(name)
    worker = f"upgraded_worker_{uuid.uuid4().hex[:8]}"
    admin.execute(f'CREATE ROLE "{worker}" NOLOGIN')
    yield worker, client_role_names
    for name in (worker, *created):
        admin.execute(f'DROP OWNED BY "{name}"')
        admin.execute(f'DROP ROLE "{name}"')


def _grant_worker_recipe(conn, worker: str) -> None:
    """docs/permissions.md's worker recipe, applied before the upgrade (EXECUTE on what exists then)."""
    conn.execute(f'GRANT USAGE ON SCHEMA pgflow TO "{worker}"')
    conn.execute(f'GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgflow TO "{worker}"')


def _check_upgraded(conn, fresh: dict[str, str], worker: str, clients: Sequence[str], level: int) -> None:
    plan = installer.make_plan(conn)
    assert plan.pending == []
    assert {f.state for f in plan.files} == {"current"}
    assert dict(conn.execute(FUNCTIONS).fetchall()) == fresh
    unreachable = [f for f in conn.execute(UNREACHABLE, (worker,)).fetchone()[0] if not f.startswith(OPERATOR_ONLY)]
    # from level 9 on the recipe itself hands the worker role the manual entry points, which exist then
    assert unreachable == (MANUAL_ONLY if level < 9 else [])
    for grantee in ("public", *clients):
        assert conn.execute(REACHABLE, (grantee,)).fetchone()[0] == [], grantee


@pytest.mark.parametrize("level", _every_level()[:-1])
def test_an_upgrade_from_every_level_through_0014_keeps_grants_and_installs_the_newest_text(
        level, baseline_db, db, roles, monkeypatch):
    """0014 re-applies _complete_worker_task, complete_tasks and fail_tasks, which 0010 creates and grants."""
    worker, clients = roles
    conn = baseline_db.connect()
    conn.autocommit = True
    at_level(conn, level, monkeypatch)
    _grant_worker_recipe(conn, worker)
    installer.apply(conn)
    with db.connect() as fresh:
        expected = dict(fresh.execute(FUNCTIONS).fetchall())
    _check_upgraded(conn, expected, worker, clients, level)


# --- a later migration that re-applies every file ------------------------------------------------

def _reapplied_paths() -> list[str]:
    return sorted({a.path for m in installer.available_migrations() for a in m.applies})


@pytest.fixture
def reapply_tree(tmp_path, monkeypatch, baseline_db, db) -> Iterator[str]:
    """A copy of sql/ with one more migration, 0099, that re-applies every function file any
    migration applies. Depends on ``baseline_db`` and ``db`` so that the session's template
    databases are built from the real tree first."""
    root = tmp_path / "sql"
    shutil.copytree(sqlfiles.sql_root(), root)
    lines = [f"--@apply {path} sha256={sqlfiles.checksum(sqlfiles.load(path))}" for path in _reapplied_paths()]
    (root / "migrations/0099_reapply_everything.sql").write_text(
        "-- 0099 reapply everything: every function file again (a test of the installer's rule).\n"
        + "\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.setattr(sqlfiles, "sql_root", lambda: root)
    _clear()
    yield "0099_reapply_everything"
    _clear()


def _clear() -> None:
    sqlfiles.load.cache_clear()
    sqlfiles.named_statements.cache_clear()
    installer.available_migrations.cache_clear()


@pytest.mark.parametrize("level", _every_level())
def test_a_migration_may_reapply_every_file_whatever_level_the_upgrade_starts_from(
        level, reapply_tree, baseline_db, empty_db, roles, monkeypatch):
    """Every file an earlier migration creates, drops and recreates (0005's register_worker), grants
    (0004, 0005, 0009, 0010, 0013) or hangs a trigger on (0007, 0009) is applied again by 0099."""
    worker, clients = roles
    with empty_db.connect() as fresh:
        fresh.autocommit = True
        installer.install(fresh)
        expected = dict(fresh.execute(FUNCTIONS).fetchall())
    conn = baseline_db.connect()
    conn.autocommit = True
    at_level(conn, level, monkeypatch)
    _grant_worker_recipe(conn, worker)
    applied = installer.apply(conn)
    assert applied[-1].migration.label == reapply_tree
    _check_upgraded(conn, expected, worker, clients, level)


def test_an_earlier_migration_creates_only_what_is_missing_and_keeps_existing_text(baseline_db):
    """In an upgrade from 0003, 0010 creates complete_tasks (new) but leaves complete_task, which
    exists since 0003, with its installed text until 0013 replaces it; the ledger records each
    file only for the migration that ran it in full."""
    conn = baseline_db.connect()
    conn.autocommit = True
    installer.apply(conn, target=3)
    todo = installer.make_plan(conn).pending
    skips = installer.file_runs(installer.available_migrations(), todo)
    assert "functions/runtime/complete_tasks.sql" in skips[10]
    at_0010 = next(m for m in todo if m.version == 10)
    executed = at_0010.executed(skips[10])
    assert executed.count("DO $pgflow_create_only$") == len(skips[10])
    seen: dict[int, str | None] = {}

    def hook(c, migration: Migration) -> None:
        row = c.execute("SELECT to_regprocedure('pgflow.complete_tasks(jsonb)')::text, "
                        "pg_get_functiondef('pgflow.complete_task(uuid, text, integer, jsonb)'::regprocedure)").fetchone()
        seen[migration.version] = row[0]
        if migration.version == 10:
            assert row[0] == "pgflow.complete_tasks(jsonb)"
            assert "_complete_worker_progress" not in row[1]  # 0013's text arrives with 0013
        if migration.version == 13:
            assert "_complete_worker_progress" in row[1]

    installer.apply(conn, before_commit=hook)
    assert seen[9] is None and seen[10] == "pgflow.complete_tasks(jsonb)"
    recorded = conn.execute("SELECT version FROM pgflow.schema_migration_files "
                            "WHERE path = 'functions/runtime/complete_tasks.sql' ORDER BY 1").fetchall()
    assert recorded == [(14,)]

"""Every migration declares the table locks its transactions take, so the runner can take them first.

The runner takes a migration's ``--@lock`` plan before any of its SQL (installer.locks.take_locks).
A lock the SQL takes later that is not in the plan brings back a wait while holding locks, the
deadlock of issue 14 item 1. This test runs every shipped migration (0004+ included, whoever
writes them) and compares the locks its transaction holds just before commit with its plan.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg.rows import dict_row

from pgflow_cli import installer, sqlfiles
from pgflow_cli.installer.files import LOCK_MODES, LOCK_ORDER, TableLock, merge_locks, parse_locks

PG_MODES = {mode.title().replace(" ", "") + "Lock": mode for mode in LOCK_MODES}
"""pg_locks spelling (``ShareRowExclusiveLock``) -> LOCK TABLE spelling."""
WEAKEST_THAT_MATTERS = LOCK_MODES.index("SHARE UPDATE EXCLUSIVE")
"""Weaker modes (reads, row writes) conflict with nothing the runtime takes."""


def _relations(conn: psycopg.Connection) -> set[int]:
    return {r[0] for r in conn.execute(
        "SELECT c.oid::bigint FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace "
        "WHERE n.nspname IN ('pgflow', 'pgmq') AND c.relkind IN ('r', 'p')").fetchall()}


def _covered(held: str, declared: TableLock | None) -> bool:
    if declared is None:
        return False
    return merge_locks([TableLock(declared.table, held), declared])[0].mode == declared.mode


@pytest.mark.parametrize("online", ["never", "always"])
def test_every_migration_takes_its_locks_up_front(empty_db, online):
    conn = empty_db.connect()
    installer.ensure_pgmq(conn)
    seen: dict[int, list[dict]] = {}
    existing: dict[int, set[int]] = {}
    snapshot = [_relations(conn)]

    def hook(c: psycopg.Connection, m: installer.Migration) -> None:
        # runs in each migration's (final) transaction just before it commits: its locks, and the
        # relations the next migration finds already there
        existing[m.version] = snapshot[0]
        with c.cursor(row_factory=dict_row) as cur:
            seen[m.version] = cur.execute(
                "SELECT l.relation::bigint AS oid, n.nspname || '.' || c.relname AS tbl, l.mode "
                "FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation "
                "JOIN pg_namespace AS n ON n.oid = c.relnamespace "
                "WHERE l.pid = pg_backend_pid() AND l.granted AND l.locktype = 'relation'").fetchall()
        snapshot[0] = _relations(c)

    # intermediate levels above 3 may not be installable on their own (a later migration changed
    # their function files), so the baseline is installed first and the rest in one apply
    installer.apply(conn, target=installer.BASELINE_VERSION, online=online, before_commit=hook)
    conn.execute(sqlfiles.load("optional/prune_baseline.sql"))  # the upgrade replaces it too
    snapshot[0] = _relations(conn)
    installer.apply(conn, online=online, before_commit=hook)
    migrations = installer.available_migrations()
    assert sorted(seen) == [m.version for m in migrations]
    for migration in migrations:
        phased = migration.phased
        if online == "always" and phased and phased.has_online_phases:
            plan = migration.locks_for([phased.apply_phases[-1].name])
        else:
            plan = migration.locks_for([None, *(p.name for p in migration.phases_for_single_transaction())])
        declared = {lock.table: lock for lock in plan}
        missing = sorted(
            f"{r['tbl']} {PG_MODES[r['mode']]}" for r in seen[migration.version]
            if r["oid"] in existing[migration.version]
            and r["tbl"] not in ("pgflow.schema_migrations", "pgflow.schema_migration_files")
            and LOCK_MODES.index(PG_MODES[r["mode"]]) >= WEAKEST_THAT_MATTERS
            and not _covered(PG_MODES[r["mode"]], declared.get(r["tbl"])))
        assert not missing, (
            f"{migration.label} locks tables its plan does not name; add a '--@lock TABLE MODE' line to the phase "
            f"(docs/architecture.md \"Locks a migration takes\"): {missing}")
        order = [lock.table for lock in plan if lock.table in LOCK_ORDER]
        assert order == sorted(order, key=LOCK_ORDER.index)


def test_lock_lines_are_checked():
    assert parse_locks("--@phase main\n--@lock pgflow.steps ACCESS EXCLUSIVE\n", "x") == {
        "main": (TableLock("pgflow.steps", "ACCESS EXCLUSIVE"),)}
    with pytest.raises(RuntimeError, match="malformed"):
        parse_locks("--@lock pgflow.steps EXCLUSIVELY\n", "x")
    merged = merge_locks([TableLock("pgflow.step_tasks", "SHARE"), TableLock("pgflow.flows", "ROW EXCLUSIVE"),
                          TableLock("pgflow.step_tasks", "SHARE UPDATE EXCLUSIVE")])
    assert merged == (TableLock("pgflow.flows", "ROW EXCLUSIVE"), TableLock("pgflow.step_tasks", "SHARE ROW EXCLUSIVE"))

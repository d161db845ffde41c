"""Migrations from 0004 on apply function files by name (``--@apply``), with pinned checksums.

These tests run the installer on a copy of sql/ with two example migrations in place of the
real 0004+: 0004 adds a column and applies an older text of calculate_retry_delay.sql, 0005
applies its current text.
"""

from __future__ import annotations

import shutil

import pytest

from pgflow_cli import installer, sqlfiles, sqlfreeze
from pgflow_cli.errors import StateConflict
from tests.layout.catalog import definitions

FILE = "functions/runtime/calculate_retry_delay.sql"
"""An example file no migration from 0004 on changes yet (0002 still includes it directly)."""
SIGNATURE = "pgflow.calculate_retry_delay(numeric, integer)"
OLDER = "0" * 64  # stands for the text 0004 applied when it was written


@pytest.fixture
def tree(tmp_path, monkeypatch, baseline_db):
    """A copy of sql/ with migrations 0004 and 0005 that the installer reads instead of the real one.

    Depends on ``baseline_db`` so that the session's template databases are built from the real
    tree before the copy takes its place."""
    root = tmp_path / "sql"
    shutil.copytree(sqlfiles.sql_root(), root)
    for real in (root / "migrations").glob("*.sql"):
        if int(real.name.split("_", 1)[0]) >= 4:
            real.unlink()  # the examples below stand in for the shipped migrations from 0004 on
    released = sqlfiles.load(FILE)
    example = root / FILE
    example.write_text(example.read_text(encoding="utf-8").replace(
        "AS $$\n", "AS $$\n  -- 0005: the text the example migrations ship\n", 1), encoding="utf-8")
    monkeypatch.setattr(sqlfiles, "sql_root", lambda: root)
    _clear()
    # what sqlfreeze does after such an edit: 0002 keeps its released text through a recipe
    frozen = f"released/0002/{FILE}"
    (root / frozen).parent.mkdir(parents=True, exist_ok=True)
    (root / frozen).write_text(sqlfreeze.recipe(released, [FILE], "the example file as 0002 released it"), encoding="utf-8")
    baseline = root / "migrations/0002_baseline_runtime.sql"
    baseline.write_text(baseline.read_text(encoding="utf-8").replace(
        f"--@include {FILE} as-create", f"--@include {frozen} as-create"), encoding="utf-8")
    _clear()
    assert sqlfiles.checksum(sqlfiles.load("migrations/0002_baseline_runtime.sql")) == \
        sqlfreeze.RELEASED_CHECKSUMS["migrations/0002_baseline_runtime.sql"]
    current = sqlfiles.checksum(sqlfiles.load(FILE))
    (root / "migrations/0004_example_column.sql").write_text(
        "-- 0004 example column: a once-only change plus an older text of the example file.\n"
        "ALTER TABLE pgflow.flows ADD COLUMN example_note text;\n"
        f"--@apply {FILE} sha256={OLDER}\n", encoding="utf-8")
    (root / "migrations/0005_example_again.sql").write_text(
        "-- 0005 example again: the example file's current text.\n"
        f"--@apply {FILE} sha256={current}\n"
        "COMMENT ON COLUMN pgflow.flows.example_note IS 'example';\n", encoding="utf-8")
    _clear()
    yield root
    _clear()


def _clear() -> None:
    sqlfiles.load.cache_clear()
    sqlfiles.named_statements.cache_clear()
    installer.available_migrations.cache_clear()


def _files(conn) -> list[tuple]:
    return conn.execute("SELECT version, path, checksum FROM pgflow.schema_migration_files ORDER BY 1, 2").fetchall()


def test_each_file_runs_once_in_the_last_migration_and_is_recorded(tree, empty_db, baseline_db):
    current = sqlfiles.checksum(sqlfiles.load(FILE))
    with empty_db.connect() as conn:
        applied = installer.install(conn)
        assert [a.migration.version for a in applied] == [1, 2, 3, 4, 5]
        assert _files(conn) == [(5, FILE, current)]
        assert "0005: the text" in conn.execute(
            "SELECT pg_get_functiondef(%s::regprocedure)", (SIGNATURE,)).fetchone()[0]
        plan = installer.make_plan(conn)
        assert [(f.path, f.state) for f in plan.files] == [(FILE, "current")]
        fresh = definitions(conn)
    with baseline_db.connect() as conn:
        assert [s.state for s in installer.make_plan(conn).files] == ["pending"]
        installer.apply(conn)
        assert _files(conn) == [(5, FILE, current)]
        assert definitions(conn) == fresh


def test_a_target_below_a_later_change_of_an_applied_file_is_refused(tree, baseline_db):
    with baseline_db.connect() as conn:
        with pytest.raises(StateConflict, match="cannot stop at migration 0004") as refused:
            installer.apply(conn, target=4)
        assert "0005" in refused.value.hint
        assert [s.version for s in installer.make_plan(conn).pending] == [3, 4, 5]  # nothing applied
        installer.apply(conn, target=3)  # the released levels stay reachable
        assert conn.execute("SELECT pgflow.protocol_version()").fetchone()[0] == 2


def test_editing_an_applied_file_changes_no_migration_checksum_and_is_reported(tree, empty_db):
    with empty_db.connect() as conn:
        installer.install(conn)
    before = {m.version: m.checksum for m in installer.available_migrations()}
    path = tree / FILE
    path.write_text(path.read_text(encoding="utf-8").replace("-- 0005:", "-- 0006:"), encoding="utf-8")
    _clear()
    assert {m.version: m.checksum for m in installer.available_migrations()} == before
    with empty_db.connect() as conn:
        plan = installer.make_plan(conn)
        assert [s.state for s in plan.statuses if s.version >= 4] == ["applied", "applied"]
        assert [(f.path, f.state) for f in plan.file_drift] == [(FILE, "differs")]
    with pytest.raises(StateConflict, match="differs from the text migration 0005_example_again pins"):
        installer.file_runs(installer.available_migrations(), installer.available_migrations()[3:])

"""A fresh install and an upgrade from the baseline end with the same definitions, byte for byte, and
every function is installed exactly as its file says."""

from __future__ import annotations

from pathlib import Path

from pgflow_cli import installer, sqlfiles
from pgflow_cli.installer.catalog import function_files, optional_function_files
from tests.layout.catalog import definitions


def _is_type(path: str) -> bool:
    return "CREATE TYPE " in sqlfiles.load(path)


def _rerun(conn, paths) -> dict[str, str]:
    """The definitions after running ``paths`` again with their bodies checked (rolled back)."""
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL check_function_bodies = on")
        for path in paths:
            conn.execute(sqlfiles.load(path))
        return definitions(conn)


def test_upgrade_from_baseline_defines_every_routine_as_a_fresh_install(db, baseline_db):
    with baseline_db.connect() as conn:
        assert installer.make_plan(conn).pending, "the baseline database must have pending migrations"
        installer.apply(conn)
        upgraded = definitions(conn)
    with db.connect() as conn:
        fresh = definitions(conn)
    assert len(fresh) >= 60  # every function, type and trigger of the runtime, not an empty schema
    assert sorted(fresh) == sorted(upgraded)
    different = [name for name in fresh if fresh[name] != upgraded[name]]
    assert different == []


def test_every_function_is_installed_as_its_file_says(db):
    """Running every function file again (bodies checked) changes no definition, comment or grant."""
    paths = [p for p in function_files() if not _is_type(p) and p not in optional_function_files()]
    with db.connect() as conn:
        installed = definitions(conn)
        again = _rerun(conn, paths)
    assert len(paths) >= 80
    assert sorted(again) == sorted(installed)
    assert [name for name in installed if installed[name] != again[name]] == []


def test_a_function_installed_on_request_is_upgraded_to_its_file(baseline_db):
    (optional,) = optional_function_files()
    with baseline_db.connect() as conn:
        conn.execute(sqlfiles.load("optional/prune_baseline.sql"))
        installer.apply(conn)
        installed = definitions(conn)
        assert _rerun(conn, [optional]) == installed
        assert any(name.startswith(f"function pgflow.{Path(optional).stem}(") for name in installed)


def test_every_composite_type_is_its_file(db, empty_db):
    types = [p for p in function_files() if _is_type(p)]
    assert types
    with empty_db.connect() as conn:
        conn.execute("CREATE SCHEMA pgflow")
        for path in types:
            conn.execute(sqlfiles.load(path))
        written = {k: v for k, v in definitions(conn).items() if k.startswith("type ")}
    with db.connect() as conn:
        installed = {k: v for k, v in definitions(conn).items() if k.startswith("type ")}
    assert written == installed and len(written) == len(types)


def test_the_baseline_still_has_the_protocol_1_runtime(baseline_db):
    with baseline_db.connect() as conn:
        baseline = definitions(conn)
        assert conn.execute("SELECT pgflow.protocol_version()").fetchone()[0] == 1
    assert "function pgflow.start_tasks(text,bigint[],uuid)" in baseline
    assert "PF002" not in baseline["function pgflow.start_tasks(text,bigint[],uuid)"]
    assert not any(name.startswith("function pgflow.claim_tasks(") for name in baseline)

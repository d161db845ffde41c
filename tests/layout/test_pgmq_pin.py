"""The PGMQ SQL that pgflow-cli installs is pinned: version and SHA-256 checked, recorded in the schema comment."""

from __future__ import annotations

import hashlib
import sys

import pytest

from pgflow_cli import installer
from pgflow_cli.errors import StateConflict


def test_the_bundled_sql_is_the_pinned_one():
    version, script = installer.bundled_pgmq_sql()
    assert version == installer.PGMQ_SQL_VERSION
    assert hashlib.sha256(script.encode("utf-8")).hexdigest() == installer.PGMQ_SQL_SHA256


def test_the_installed_version_is_recorded(db):
    with db.connect() as conn:
        comment = conn.execute("SELECT obj_description('pgmq'::regnamespace, 'pg_namespace')").fetchone()[0]
        assert f"PGMQ {installer.PGMQ_SQL_VERSION} " in comment
        assert installer.PGMQ_SQL_SHA256[:12] in comment
        assert installer.read_state(conn).pgmq_version == installer.PGMQ_SQL_VERSION


def test_another_pgmq_release_installs_nothing(tmp_path, monkeypatch, empty_db):
    package = tmp_path / "pgmq"
    (package / "sql").mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "sql" / "VERSION").write_text("9.9.9\n", encoding="utf-8")
    (package / "sql" / "pgmq.sql").write_text("CREATE SCHEMA pgmq; CREATE TABLE pgmq.meta ();\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in sys.modules if n == "pgmq" or n.startswith("pgmq.")]:
        monkeypatch.delitem(sys.modules, name)
    with empty_db.connect() as conn:
        with pytest.raises(StateConflict, match="bundles PGMQ SQL 9.9.9, not the PGMQ") as refused:
            installer.ensure_pgmq(conn)
        assert "pgmq==1.1.4" in refused.value.hint
        assert not installer.read_state(conn).has_pgmq_schema


def test_pyproject_pins_the_same_release():
    from pathlib import Path

    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    assert f'"{installer.pgmq_bootstrap.PGMQ_PACKAGE}"' in pyproject

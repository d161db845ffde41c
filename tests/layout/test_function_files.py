"""The rules of the SQL layout (docs/architecture.md "SQL layout"), checked on the shipped tree."""

from __future__ import annotations

import re
from pathlib import Path

from pgflow_cli import installer, sqlfiles
from pgflow_cli.installer.catalog import function_files
from pgflow_cli.installer.files import DIRECTIVES
from scripts import regenerate_migration

ROOT = sqlfiles.sql_root()
CREATED = re.compile(r"^CREATE (?:OR REPLACE )?(?:FUNCTION|TYPE|VIEW|TRIGGER) (?:pgflow\.)?(?P<name>[a-z_0-9]+)", re.M)
DIRECTIVE = re.compile(r"^[ \t]*(?P<directive>--@[a-z-]+)", re.M)


def test_each_function_file_is_named_after_what_it_creates():
    for path in function_files():
        names = CREATED.findall((ROOT / path).read_text(encoding="utf-8"))
        stem = Path(path).stem.removesuffix("_protocol1")
        assert names and names[0] == stem, f"sql/{path} creates {names[:1]}, not pgflow.{stem}"


def test_the_unreleased_migration_is_what_the_script_generates_from_the_files():
    migration = regenerate_migration.unreleased()
    assert regenerate_migration.regenerated(migration) == migration.text, (
        f"sql/{migration.path} is stale (a function file, a part or sql/audit/findings.sql changed): run "
        "`.venv/bin/python scripts/regenerate_migration.py` and commit the result")


def test_the_generated_sections_hold_every_function_file_once():
    """Every function and type file, except a type a released migration creates (it never changes)."""
    migration = regenerate_migration.unreleased()
    generated = migration.section("types") + migration.section("functions")
    released = "".join(m.text for m in installer.available_migrations() if m.released)
    for path in function_files():
        count = generated.count(f"-- sql/{path}\n") + generated.count(f"-- sql/{path} (")
        assert count == (0 if f"CREATE TYPE pgflow.{Path(path).stem} " in released else 1), path


def test_a_migration_is_literal_and_holds_only_installer_directives():
    for migration in installer.available_migrations():
        found = {m["directive"] for m in DIRECTIVE.finditer(migration.text)}
        assert found <= set(DIRECTIVES), (
            f"sql/{migration.path} holds {sorted(found - set(DIRECTIVES))}: a migration is literal SQL; its only "
            f"directives are {', '.join(DIRECTIVES)}")
        assert "{{" not in migration.text, f"sql/{migration.path} holds a placeholder"


def test_parts_are_included_by_function_files_only():
    users: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.sql"):
        for match in sqlfiles.INCLUDE.finditer(path.read_text(encoding="utf-8")):
            users.setdefault(match["path"], set()).add(str(path.relative_to(ROOT)))
    for part in (ROOT / "functions").rglob("parts/*.sql"):
        relative = str(part.relative_to(ROOT))
        assert users.get(relative), f"sql/{relative} is included by nothing"
        assert all(user.startswith("functions/") for user in users[relative]), (relative, users[relative])
    for path, includers in users.items():
        if path.startswith("functions/") and "/parts/" not in path:
            assert includers <= {"optional/prune.sql"}, f"sql/{path} is included by {includers}"

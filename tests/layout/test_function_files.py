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


def test_the_newest_migration_is_what_the_script_generates_from_the_files():
    """The unreleased migration, or right after a release the newest released one (its types and
    functions: a function changed after a release needs the next migration)."""
    migration = regenerate_migration.newest()
    assert regenerate_migration.regenerated(migration) == migration.text, (
        regenerate_migration.stale_message(migration) + " and commit the result")


def test_the_generated_sections_hold_every_function_file_once():
    """Every function and type file, except a type an earlier migration creates (it never changes)."""
    migration = regenerate_migration.newest()
    generated = migration.section("types") + migration.section("functions")
    released = "".join(m.text for m in installer.available_migrations() if m.version < migration.version)
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


def test_every_function_file_is_a_whole_function():
    """A function file holds its function's whole text, as psql's \\sf shows it: it includes nothing but
    a shared fragment (a rule the audit implements too, sql/fragments), no file includes a function
    file but the optional install that carries it, and no directive has arguments."""
    assert not list((ROOT / "functions").rglob("parts")), "sql/functions/*/parts: write the lines out or make a function"
    users: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.sql"):
        text = path.read_text(encoding="utf-8")
        assert "{{" not in text, f"sql/{path.relative_to(ROOT)} holds a placeholder"
        for match in sqlfiles.INCLUDE.finditer(text):
            assert not match["rest"].strip(), (str(path.relative_to(ROOT)), match.group(0))
            users.setdefault(match["path"], set()).add(str(path.relative_to(ROOT)))
    for path in function_files():
        included = {target for target, includers in users.items() if path in includers}
        assert all(target.startswith("fragments/") for target in included), (path, included)
    for path, includers in users.items():
        if path.startswith("functions/"):
            assert includers <= {"optional/prune.sql"}, f"sql/{path} is included by {includers}"

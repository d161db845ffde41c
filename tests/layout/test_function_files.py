"""The rules of the SQL layout (docs/architecture.md "SQL layout"), checked on the shipped tree."""

from __future__ import annotations

import re
from pathlib import Path

from pgflow_cli import installer, sqlfiles

ROOT = sqlfiles.sql_root()
CREATED = re.compile(r"^CREATE (?:OR REPLACE )?(?:FUNCTION|TYPE|VIEW|TRIGGER) (?:pgflow\.)?(?P<name>[a-z_0-9]+)", re.M)
INCLUDE = re.compile(r"^[ \t]*--@include[ \t]+(?P<path>\S+)(?P<options>[^\n]*)$", re.M)


def _function_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "functions").rglob("*.sql") if p.parent.name != "parts")


def _whole_includes(relative: str, seen: set[str]) -> set[str]:
    """Files whose complete current text ``relative`` executes (not line ranges, not recipes)."""
    for match in INCLUDE.finditer((ROOT / relative).read_text(encoding="utf-8")):
        target = match["path"]
        if "lines=" in match["options"] or target in seen:
            continue
        seen.add(target)
        _whole_includes(target, seen)
    return seen


def test_each_function_file_is_named_after_what_it_creates():
    for path in _function_files():
        names = CREATED.findall((ROOT / path).read_text(encoding="utf-8"))
        stem = Path(path).stem.removesuffix("_protocol1")
        assert names and names[0] == stem, f"sql/{path} creates {names[:1]}, not pgflow.{stem}"


def test_every_function_file_is_installed_with_its_current_text():
    """A fresh install runs the current text of every function file: a released migration still
    includes it whole, or the newest migration that applies it pins its current checksum."""
    migrations = installer.available_migrations()
    included: set[str] = set()
    for migration in migrations:
        _whole_includes(migration.path, included)
    newest: dict[str, installer.FileApply] = {}
    for migration in migrations:
        for applied in migration.applies:
            newest[applied.path] = applied
    for path in _function_files():
        checksum = sqlfiles.checksum(sqlfiles.load(path))
        if path in newest:
            assert newest[path].pinned == checksum, (
                f"sql/{path} changed after the migration that last applies it was written: add "
                f"'--@apply {path} sha256={checksum}' to a new migration (or to the newest one, if it is not "
                "released yet); docs/architecture.md \"How to change a function\"")
        else:
            assert path in included, (
                f"sql/{path} is installed by no migration: add '--@apply {path} sha256={checksum}' "
                "to a new migration; docs/architecture.md \"How to change a function\"")


def test_parts_are_shared_and_released_text_is_only_used_by_released_migrations():
    users: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.sql"):
        for match in INCLUDE.finditer(path.read_text(encoding="utf-8")):
            users.setdefault(match["path"], set()).add(str(path.relative_to(ROOT)))
    for part in (ROOT / "functions").rglob("parts/*.sql"):
        relative = str(part.relative_to(ROOT))
        assert users.get(relative), f"sql/{relative} is included by nothing"
    for migration in installer.available_migrations():
        if migration.version <= 3:
            continue
        text = (ROOT / migration.path).read_text(encoding="utf-8")
        for match in INCLUDE.finditer(text):
            assert not match["path"].startswith(("baseline/", "released/", "functions/")), (
                f"{migration.path} includes {match['path']}: a new migration applies function files with --@apply")

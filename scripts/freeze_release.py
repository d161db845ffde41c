"""Freeze a release: pin the unreleased migration's checksum and set the package version.

    .venv/bin/python scripts/freeze_release.py 0.1.0rc1            # edit the files, print what is left
    .venv/bin/python scripts/freeze_release.py 0.1.0rc1 --dry-run  # say what it would change

A developer tool, not part of the shipped package (docs/releasing.md). It refuses unless exactly
one migration is unreleased and it is what ``scripts/regenerate_migration.py`` generates (a stale
migration would be frozen stale). Then it writes the migration's SHA-256 in the two places that
pin released migrations, independently of each other on purpose:

* ``pgflow_cli/installer/files.py`` ``RELEASED_CHECKSUMS``: what the tool treats as released;
* ``tests/layout/test_released.py`` ``RELEASED``: what the test holds the files to;

and the version in its one place, ``pgflow_cli/__init__.py`` ``__version__`` (the wheel's
metadata takes it from there: ``[tool.hatch.version]`` in pyproject.toml). The CHANGELOG section,
the build, the validation and the tag are the release manager's (docs/releasing.md).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from packaging.version import InvalidVersion, Version

from pgflow_cli import installer, sqlfiles
from scripts import regenerate_migration

REPO = Path(__file__).resolve().parent.parent
VERSION_FILE = REPO / "pgflow_cli" / "__init__.py"
TOOL_PINS = REPO / "pgflow_cli" / "installer" / "files.py"
TEST_PINS = REPO / "tests" / "layout" / "test_released.py"

_VERSION = re.compile(r'^__version__ = "(?P<version>[^"]+)"$', re.MULTILINE)
_TOOL_DICT = re.compile(r"^RELEASED_CHECKSUMS: dict\[str, str\] = \{\n(?P<body>(?:    .*\n)*?)\}$", re.MULTILINE)
_TEST_DICT = re.compile(r"^RELEASED = \{\n(?P<body>(?:    .*\n)*?)\}$", re.MULTILINE)


class Refused(Exception):
    """The tree cannot be frozen as it is (the message says why and what to do)."""


def _add_entry(text: str, pattern: re.Pattern[str], entry: str, where: str) -> str:
    """``text`` with ``entry`` (one line, without indentation) appended to the dict ``pattern`` finds."""
    match = pattern.search(text)
    if match is None:
        raise Refused(f"{where}: the dict of released checksums is not where this script expects it")
    end = match.end("body")
    return text[:end] + f"    {entry}\n" + text[end:]


def planned_edits(version: str) -> dict[Path, str]:
    """The new text of each file the freeze changes.

    Args:
        version: the release's version (PEP 440, normalised form), e.g. ``0.1.0rc1``.

    Raises:
        Refused: a version that is not PEP 440 or not newer than the current one, no unreleased
            migration, or one the files no longer generate.
    """
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise Refused(f"{version!r} is not a PEP 440 version (e.g. 0.1.0rc1, 0.1.0)") from None
    if str(parsed) != version:
        raise Refused(f"write the version in its normalised form: {parsed}")
    package = VERSION_FILE.read_text(encoding="utf-8")
    current = _VERSION.search(package)
    if current is None:
        raise Refused(f"{VERSION_FILE.relative_to(REPO)} has no __version__ line")
    if parsed <= Version(current["version"]):
        raise Refused(f"{version} is not newer than the current version {current['version']}")

    unreleased = [m for m in installer.available_migrations() if not m.released]
    if not unreleased:
        raise Refused("no unreleased migration: nothing to freeze (a release without a schema change only "
                      "bumps the version)")
    migration = regenerate_migration.unreleased()
    if regenerate_migration.regenerated(migration) != migration.text:
        raise Refused(regenerate_migration.stale_message(migration) + ", commit it, then freeze")
    checksum = sqlfiles.checksum(migration.text)

    return {
        VERSION_FILE: _VERSION.sub(f'__version__ = "{version}"', package, count=1),
        TOOL_PINS: _add_entry(TOOL_PINS.read_text(encoding="utf-8"), _TOOL_DICT,
                              f'"{migration.path}": "{checksum}",', str(TOOL_PINS.relative_to(REPO))),
        TEST_PINS: _add_entry(TEST_PINS.read_text(encoding="utf-8"), _TEST_DICT,
                              f'{migration.version}: "{checksum}",', str(TEST_PINS.relative_to(REPO))),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("version", help="the release's PEP 440 version, e.g. 0.1.0rc1")
    parser.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
    args = parser.parse_args(argv)
    try:
        edits = planned_edits(args.version)
    except Refused as refused:
        print(f"refused: {refused}", file=sys.stderr)
        return 1
    migration = regenerate_migration.unreleased()
    print(f"{'would freeze' if args.dry_run else 'froze'} sql/{migration.path} "
          f"(SHA-256 {sqlfiles.checksum(migration.text)}) and set the version to {args.version}")
    for path, text in edits.items():
        print(f"  {'would edit' if args.dry_run else 'edited'} {path.relative_to(REPO)}")
        if not args.dry_run:
            path.write_text(text, encoding="utf-8")
    if not args.dry_run:
        print("next (docs/releasing.md): CHANGELOG section, `.venv/bin/pytest -q -n 2 tests/layout tests/release`, "
              "build and check the artifacts, re-run the validation, commit, tag")
    return 0


if __name__ == "__main__":
    sys.exit(main())

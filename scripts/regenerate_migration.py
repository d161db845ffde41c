"""Rewrite the generated sections of the one unreleased migration from the files they come from.

    .venv/bin/python scripts/regenerate_migration.py          # rewrite it
    .venv/bin/python scripts/regenerate_migration.py --check  # exit 1 when it is stale (tests/layout does this)

A developer tool, not part of the shipped package. The unreleased migration is the one
``sql/migrations`` file whose checksum is not in ``installer.RELEASED_CHECKSUMS`` (at most one
exists). Its generated sections stand between marker lines (``-- >>> NAME ...`` and
``-- <<< NAME``, :data:`pgflow_cli.installer.files.SECTION`):

* ``recheck``: the blocking rules of ``sql/audit/findings.sql`` in a ``DO`` block that raises PF005;
* ``types``: the composite types of ``sql/functions`` that no released migration creates;
* ``functions``: every other file of ``sql/functions`` (a shared fragment of ``sql/fragments``
  expanded where one is included), with ``check_function_bodies`` off around them so their order
  does not matter;
  a file that ``sql/optional`` installs on request (pruning) is replaced only where it is installed.

Every other line of the migration is written by hand and kept as it is.

Once a release has frozen the newest migration (no unreleased one exists), ``--check`` holds the
files to that release instead: the ``types`` and ``functions`` sections the files generate must be
those of the newest released migration, byte for byte. A function changed after a release needs
the next migration (``sql/migrations/NNNN_name.sql``, with empty generated sections between their
marker lines): the script never rewrites a released migration. Its ``recheck`` is not compared:
the installer runs the current audit's rules under a released migration's locks whenever its own
copy is older (``pgflow_cli.installer.steps``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pgflow_cli import installer, sqlfiles
from pgflow_cli.installer.catalog import function_files, optional_function_files
from pgflow_cli.installer.files import recheck_block, replace_sections

GENERATED = ("recheck", "types", "functions")
"""The sections this script writes (``grants`` is written by hand)."""

OPTIONAL = """\
DO $optional$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS p
             WHERE p.pronamespace = 'pgflow'::regnamespace AND p.proname = '{name}') THEN
    EXECUTE $optional_sql$
{text}
$optional_sql$;
  END IF;
END
$optional$;"""


RELEASED_SECTIONS = ("types", "functions")
"""The generated sections the files must still produce for the newest released migration."""


def unreleased() -> installer.Migration:
    """The one migration that is not released (the newest).

    Raises:
        SystemExit: none or several (the rule of docs/architecture.md "SQL layout").
    """
    found = [m for m in installer.available_migrations() if m.path not in installer.RELEASED_CHECKSUMS]
    if len(found) != 1:
        raise SystemExit(f"expected exactly one unreleased migration, found {[m.path for m in found]}")
    return found[0]


def newest() -> installer.Migration:
    """The migration the function files are held to: the unreleased one, or the newest released one
    right after a release (before the next change adds a migration).

    Raises:
        SystemExit: several unreleased migrations, or one that is not the newest.
    """
    migrations = installer.available_migrations()
    found = [m for m in migrations if m.path not in installer.RELEASED_CHECKSUMS]
    if len(found) > 1 or (found and found[0] != migrations[-1]):
        raise SystemExit(f"expected at most one unreleased migration, the newest; found {[m.path for m in found]}")
    return migrations[-1]


def is_type(path: str) -> bool:
    return "CREATE TYPE " in sqlfiles.load(path)


def generated(migration: installer.Migration) -> dict[str, str]:
    """The text of each generated section of ``migration`` as the files say it now (its types: those
    no earlier migration creates)."""
    released = "\n".join(m.text for m in installer.available_migrations() if m.version < migration.version)
    optional = optional_function_files()
    types, functions = [], []
    for path in function_files():
        text = sqlfiles.load(path).rstrip("\n")
        if is_type(path):
            name = Path(path).stem
            if f"CREATE TYPE pgflow.{name} " not in released:
                types.append(f"-- sql/{path}\n{text}")
        elif path in optional:
            functions.append(f"-- sql/{path} (installed on request: replaced where installed)\n"
                             + OPTIONAL.format(name=Path(path).stem, text=text))
        else:
            functions.append(f"-- sql/{path}\n{text}")
    return {
        "recheck": recheck_block(migration.version),
        "types": "\n\n".join(types),
        "functions": "\n".join([
            "-- Function bodies are checked when they first run, not here: the files need no order.",
            "SET LOCAL check_function_bodies = off;",
            "",
            "\n\n".join(functions),
            "",
            "SET LOCAL check_function_bodies = on;",
        ]),
    }


def regenerated(migration: installer.Migration) -> str:
    """``migration``'s text with every generated section rewritten (for a released migration only the
    :data:`RELEASED_SECTIONS`: the others are not held to the current files)."""
    sections = generated(migration)
    if migration.released:
        sections = {name: sections[name] for name in RELEASED_SECTIONS}
    return replace_sections(migration.text, sections)


def stale_message(migration: installer.Migration) -> str:
    """What to do when ``migration`` is not what the files generate."""
    if migration.released:
        return (f"sql/{migration.path} is released and frozen, but sql/functions no longer generates its types "
                f"and functions: add the next migration sql/migrations/{migration.version + 1:04d}_<name>.sql "
                "(docs/releasing.md \"After a release\"), then run `.venv/bin/python scripts/regenerate_migration.py`")
    return f"sql/{migration.path} is stale: run `.venv/bin/python scripts/regenerate_migration.py`"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the migration differs from its sources")
    args = parser.parse_args(argv)
    migration = newest()
    path = sqlfiles.sql_root() / migration.path
    text = regenerated(migration)
    if text != migration.text and (args.check or migration.released):
        print(stale_message(migration), file=sys.stderr)
        return 1
    if args.check:
        return 0
    if text != migration.text:
        path.write_text(text, encoding="utf-8")
        print(f"rewrote the generated sections of sql/{migration.path}")
    else:
        print(f"sql/{migration.path} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())

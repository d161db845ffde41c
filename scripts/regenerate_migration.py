"""Rewrite the generated sections of the one unreleased migration from the files they come from.

    .venv/bin/python scripts/regenerate_migration.py          # rewrite it
    .venv/bin/python scripts/regenerate_migration.py --check  # exit 1 when it is stale (tests/layout does this)

A developer tool, not part of the shipped package. The unreleased migration is the one
``sql/migrations`` file whose checksum is not in ``installer.RELEASED_CHECKSUMS`` (at most one
exists). Its generated sections stand between marker lines (``-- >>> NAME ...`` and
``-- <<< NAME``, :data:`pgflow_cli.installer.files.SECTION`):

* ``recheck``: the blocking rules of ``sql/audit/findings.sql`` in a ``DO`` block that raises PF005;
* ``types``: the composite types of ``sql/functions`` that no released migration creates;
* ``functions``: every other file of ``sql/functions`` (``parts/`` expanded into the files that
  include them), with ``check_function_bodies`` off around them so their order does not matter;
  a file that ``sql/optional`` installs on request (pruning) is replaced only where it is installed.

Every other line of the migration is written by hand and kept as it is.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pgflow_cli import installer, sqlfiles
from pgflow_cli.installer.catalog import function_files, optional_function_files
from pgflow_cli.installer.files import replace_sections

GENERATED = ("recheck", "types", "functions")
"""The sections this script writes (``grants`` is written by hand)."""

RECHECK = """\
DO $recheck$
DECLARE
  v_count integer;
  v_detail text;
BEGIN
  SELECT pg_catalog.count(*)::integer,
         pg_catalog.string_agg(pg_catalog.format('%s %s: %s [%s]', f.check_id, f.object_name, f.message,
                                                 pg_catalog.array_to_string(f.reasons, ', ')),
                               E'\\n' ORDER BY f.flow_slug, f.check_id, f.object_name)
  INTO v_count, v_detail
  FROM (
{findings}
  ) AS f
  WHERE f.blocking;
  IF v_count > 0 THEN
    RAISE EXCEPTION USING
      ERRCODE = 'PF005',
      MESSAGE = pg_catalog.format('pgflow queue-stage upgrade refused: %s incompatible definition(s) found under '
                                  || 'the migration''s locks; this transaction was rolled back', v_count),
      DETAIL = v_detail,
      HINT = 'run `pgflow audit` for the report with fixes: a rejected name needs a new concrete flow under a '
             || 'compliant slug; pgflow never renames or deletes flows. On the phased path, rerun `pgflow migrate '
             || 'apply` afterwards to finish, or `pgflow migrate abort {version}` to undo the prepared phases';
  END IF;
END
$recheck$;"""

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


def unreleased() -> installer.Migration:
    """The one migration that is not released (the newest).

    Raises:
        SystemExit: none or several (the rule of docs/architecture.md "SQL layout").
    """
    found = [m for m in installer.available_migrations() if m.path not in installer.RELEASED_CHECKSUMS]
    if len(found) != 1:
        raise SystemExit(f"expected exactly one unreleased migration, found {[m.path for m in found]}")
    return found[0]


def is_type(path: str) -> bool:
    return "CREATE TYPE " in sqlfiles.load(path)


def generated(migration: installer.Migration) -> dict[str, str]:
    """The text of each generated section of ``migration`` as the files say it now."""
    released = "\n".join(sqlfiles.read_file(path) for path in installer.RELEASED_CHECKSUMS)
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
    findings = "\n".join(("    " + line) if line else "" for line in sqlfiles.load("audit/findings.sql").rstrip("\n").split("\n"))
    return {
        "recheck": RECHECK.format(findings=findings, version=migration.version),
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
    """``migration``'s text with every generated section rewritten."""
    return replace_sections(migration.text, generated(migration))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the migration differs from its sources")
    args = parser.parse_args(argv)
    migration = unreleased()
    path = sqlfiles.sql_root() / migration.path
    text = regenerated(migration)
    if args.check:
        if text != migration.text:
            print(f"sql/{migration.path} is stale: run `.venv/bin/python scripts/regenerate_migration.py`",
                  file=sys.stderr)
            return 1
        return 0
    if text != migration.text:
        path.write_text(text, encoding="utf-8")
        print(f"rewrote the generated sections of sql/{migration.path}")
    else:
        print(f"sql/{migration.path} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())

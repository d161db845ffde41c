"""The relational schema the runtime runs on, and the differences it cannot run with.

Two frozen shapes (``schema_facts`` of sql/queries/installer.sql, kind -> object -> detail) ship
under ``sql/shapes``: ``baseline.json``, what migrations 0001 and 0002 leave (what an adoption
must leave), and ``head.json``, what every shipped migration leaves. ``tests/upgrade/test_shapes.py``
checks both against fresh installs and rewrites them with ``PGFLOW_FREEZE_SHAPES=1``.

:func:`runtime_breaks` keeps the differences a function of the runtime would fail on: an object that
is missing, a column of another type, nullability or default, a constraint, index or trigger with
another definition, and an extra ``NOT NULL`` column without a default (every insert would fail).
Differences that do not break anything are left to the callers that list them (an extra nullable
column, a comment, a constraint still ``NOT VALID`` or an index still ``INVALID`` on the way to
being validated or rebuilt by a pending step).

:func:`repairs` gives, for each break, the statement that mends it when that is safe and keeps every
row as it is (a missing index or constraint, a missing column of an empty table, a ``varchar``
narrowed from ``text``, a lost default or ``NOT NULL``); what it cannot mend is refused by the caller.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache

from psycopg import sql as pgsql

from pgflow_cli import sqlfiles
from pgflow_cli.installer.catalog import SCHEMA_KINDS, Difference, Shape, compare

SHAPES = ("baseline", "head")


@cache
def shape(name: str) -> dict[str, dict[str, str]]:
    """The frozen shape ``name`` (``baseline`` or ``head``) from ``sql/shapes/<name>.json``."""
    if name not in SHAPES:
        raise KeyError(name)
    path = sqlfiles.sql_root() / "shapes" / f"{name}.json"
    data: dict[str, dict[str, str]] = json.loads(path.read_text(encoding="utf-8"))
    return {kind: dict(data.get(kind, {})) for kind in SCHEMA_KINDS}


_COMMENT = re.compile(r" -- .*\Z", re.S)
_PENDING = re.compile(r"(?: NOT VALID| INVALID)+\Z")
"""The marks of a constraint not yet validated (pg_get_constraintdef writes one, schema_facts another) or
an index not yet (re)built."""
_COLUMN = re.compile(r"^(?P<type>.+?)(?P<notnull> not null)?(?: default (?P<default>.+?))?"
                     r"(?P<identity> generated (?:always|by default) as identity)?\Z", re.S)


@dataclass(frozen=True)
class Column:
    """A column detail of ``schema_facts`` taken apart: type, ``NOT NULL``, default (SQL text or None)."""

    type: str
    not_null: bool
    default: str | None
    identity: bool

    @classmethod
    def parse(cls, detail: str) -> Column:
        found = _COLUMN.match(_COMMENT.sub("", detail))
        assert found is not None
        return cls(found["type"], bool(found["notnull"]), found["default"], bool(found["identity"]))


def _runtime_part(kind: str, detail: str | None) -> str | None:
    """What of a detail the runtime depends on: without comments, and without the NOT VALID or INVALID
    mark of an object a pending step validates or rebuilds."""
    if detail is None:
        return None
    detail = _COMMENT.sub("", detail)
    return _PENDING.sub("", detail) if kind in ("constraint", "index") else detail


def runtime_breaks(expected: Shape, found: Shape) -> list[Difference]:
    """The differences between ``expected`` and ``found`` the runtime cannot run with (see the module
    docstring), in :func:`~pgflow_cli.installer.catalog.compare`'s order."""
    breaks = []
    for difference in compare(expected, found, SCHEMA_KINDS):
        if difference.kind == "table" and difference.change != "missing":
            continue  # a table's comment, or a table of the operator's own
        if difference.change == "extra":
            tables = expected.get("table", {})
            if (difference.kind == "column" and difference.found is not None
                    and difference.name.split(".", 1)[0] in tables):
                column = Column.parse(difference.found)
                if column.not_null and column.default is None and not column.identity:
                    breaks.append(difference)
            continue
        if difference.change == "changed" and (_runtime_part(difference.kind, difference.expected)
                                               == _runtime_part(difference.kind, difference.found)):
            continue
        breaks.append(difference)
    return breaks


def describe(difference: Difference) -> str:
    """One line naming a break and why the runtime fails on it."""
    if difference.change == "extra":
        return (f"extra column {difference.name} ({difference.found}) is NOT NULL without a default: every insert of "
                "the runtime into its table would fail")
    if difference.change == "missing":
        detail = f" ({difference.expected})" if difference.expected else ""
        return f"missing {difference.kind} {difference.name}{detail}: the runtime uses it"
    return (f"changed {difference.kind} {difference.name}: the runtime needs {difference.expected!r}, "
            f"the database has {difference.found!r}")


_WIDENING = re.compile(r"character varying(?:\(\d+\))?\Z")


def _table(name: str) -> pgsql.Identifier:
    return pgsql.Identifier("pgflow", name)


def repairs(difference: Difference, rows: Mapping[str, bool]) -> list[pgsql.Composed]:
    """The statements that mend ``difference`` keeping every row, or ``[]`` when none is safe.

    Args:
        difference: a break from :func:`runtime_breaks`.
        rows: ``{table: has rows}`` for the pgflow tables (a missing column is re-added only to an
            empty table: for rows that exist, nobody knows the value it held).

    Each statement may still fail on the data (a unique index over duplicates, ``NOT NULL`` over a
    NULL, a check a row violates): the caller runs each under a savepoint and refuses if one fails.
    """
    kind, change, name = difference.kind, difference.change, difference.name
    expected = difference.expected or ""
    if kind == "index" and change == "missing":
        return [pgsql.Composed([pgsql.SQL(_PENDING.sub("", expected))])]  # the frozen shape's own definition
    if kind == "constraint" and change == "missing":
        table, constraint = name.split(".", 1)
        return [pgsql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
            _table(table), pgsql.Identifier(constraint), pgsql.SQL(_COMMENT.sub("", expected)))]
    if kind != "column" or change == "extra":
        return []
    table, column_name = name.split(".", 1)
    want = Column.parse(expected)
    target = pgsql.SQL("ALTER TABLE {} ").format(_table(table))
    column = pgsql.Identifier(column_name)
    if change == "missing":
        if rows.get(table, True) or want.identity:
            return []
        return [target + pgsql.SQL("ADD COLUMN {} {}{}{}").format(
            column, pgsql.SQL(want.type), pgsql.SQL(" NOT NULL" if want.not_null else ""),
            pgsql.SQL(f" DEFAULT {want.default}" if want.default else ""))]
    have = Column.parse(difference.found or "")
    statements: list[pgsql.Composed] = []
    if have.type != want.type:
        if not (want.type == "text" and _WIDENING.match(have.type)):
            return []  # only widening to text keeps every value as it is
        statements.append(target + pgsql.SQL("ALTER COLUMN {} TYPE text").format(column))
    if have.default != want.default:
        if want.default is None:
            statements.append(target + pgsql.SQL("ALTER COLUMN {} DROP DEFAULT").format(column))
        else:
            statements.append(target + pgsql.SQL("ALTER COLUMN {} SET DEFAULT {}").format(
                column, pgsql.SQL(want.default)))
    if have.not_null != want.not_null:
        statements.append(target + pgsql.SQL("ALTER COLUMN {} {} NOT NULL").format(
            column, pgsql.SQL("SET" if want.not_null else "DROP")))
    if have.identity != want.identity:
        return []
    return statements

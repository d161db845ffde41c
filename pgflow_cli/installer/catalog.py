"""Catalog facts of the pgflow schema and their comparison: with an expected shape, with the files.

Read-only. :func:`read_schema_facts` lists the relational schema (tables, columns, composite
types, constraints, indexes, triggers, comments), :func:`compare` lists how two such shapes
differ (recognition of upstream releases uses it too), and :func:`function_drift` compares the
functions the catalog holds with what the files of ``sql/functions`` say.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgflow_cli import sqlfiles
from pgflow_cli.installer.files import QUERIES

SCHEMA_KINDS = ("table", "column", "attribute", "constraint", "index", "trigger")
"""Kinds of :func:`read_schema_facts`, in report order."""


@dataclass(frozen=True)
class Difference:
    """One way a schema differs from an expected shape.

    Attributes:
        change: ``missing`` (expected, not in the database), ``extra`` (the other way round) or
            ``changed`` (both have it, with different details).
        kind: ``table``, ``column``, ``attribute``, ``constraint``, ``index``, ``trigger`` or ``function``.
        name: the object's key, e.g. ``steps.when_unmet`` or ``add_step(flow_slug text, ...)``.
        expected: the expected detail, ``None`` when extra.
        found: the database's detail, ``None`` when missing.
        source: who expects it, in :meth:`describe` (``expected``, ``release has``); not in :meth:`to_dict`.
    """

    change: str
    kind: str
    name: str
    expected: str | None = None
    found: str | None = None
    source: str = "expected"

    def describe(self) -> str:
        """One line for reports: ``missing column steps.when_unmet (text not null default ...)``."""
        if self.change == "changed":
            return f"changed {self.kind} {self.name}: {self.source} {self.expected!r}, database has {self.found!r}"
        detail = self.expected if self.change == "missing" else self.found
        return f"{self.change} {self.kind} {self.name}" + (f" ({detail})" if detail else "")

    def to_dict(self) -> dict[str, Any]:
        return {"change": self.change, "kind": self.kind, "name": self.name, "expected": self.expected,
                "found": self.found}


Shape = Mapping[str, Mapping[str, str]]
"""kind -> object key -> detail."""


def compare(expected: Shape, found: Shape, kinds: Sequence[str], *, source: str = "expected") -> list[Difference]:
    """Every difference between an expected shape and the database's objects, in a stable order
    (by kind as ``kinds`` lists them, then missing, extra, changed, each by key); ``source`` names
    who expects them in the descriptions (:attr:`Difference.source`)."""
    out: list[Difference] = []
    for kind in kinds:
        want, have = expected.get(kind, {}), found.get(kind, {})
        for key in sorted(set(want) - set(have)):
            out.append(Difference("missing", kind, key, want[key] or None, None, source))
        for key in sorted(set(have) - set(want)):
            out.append(Difference("extra", kind, key, None, have[key] or None, source))
        for key in sorted(set(want) & set(have)):
            if want[key] != have[key]:
                out.append(Difference("changed", kind, key, want[key], have[key], source))
    return out


def function_files() -> list[str]:
    """Every function file (below ``sql/``): ``sql/functions/<area>/<name>.sql``, parts excluded, in path order."""
    root = sqlfiles.sql_root()
    return sorted(str(p.relative_to(root)) for p in (root / "functions").rglob("*.sql") if p.parent.name != "parts")


def optional_function_files() -> list[str]:
    """The function files installed on request only: those a file of ``sql/optional`` includes (pruning)."""
    root = sqlfiles.sql_root()
    found = []
    for wrapper in sorted((root / "optional").glob("*.sql")):
        for match in sqlfiles.INCLUDE.finditer(wrapper.read_text(encoding="utf-8")):
            if match["path"].startswith("functions/") and match["path"] not in found:
                found.append(match["path"])
    return found


def read_schema_facts(conn: psycopg.Connection) -> dict[str, dict[str, str]]:
    """The relational schema of pgflow (``schema_facts`` of sql/queries/installer.sql), by kind."""
    facts: dict[str, dict[str, str]] = {kind: {} for kind in SCHEMA_KINDS}
    for kind, name, detail in conn.execute(sqlfiles.statement(QUERIES, "schema_facts")).fetchall():
        facts[kind][name] = detail
    return facts


# --------------------------------------------------------------------------------------------
# functions: the catalog against the files
# --------------------------------------------------------------------------------------------

_CREATE = re.compile(r"^CREATE (?:OR REPLACE )?FUNCTION pgflow\.(?P<name>[a-z_][a-z0-9_]*)\(", re.MULTILINE)
_QUOTE = re.compile(r"\bAS[ \t\n]+(?P<tag>\$[A-Za-z_]*\$)")
_VOLATILITY = {"IMMUTABLE": "i", "STABLE": "s", "VOLATILE": "v"}
_SET = re.compile(r"\bSET\s+(?P<name>[a-z_.]+)\s*(?:=|\bTO\b)\s*(?P<value>'[^']*'|[^\s,]+)", re.IGNORECASE)


@dataclass(frozen=True)
class FileFunction:
    """One ``CREATE FUNCTION pgflow.NAME(...)`` of a function file, as its text says.

    Attributes:
        name: the function's name (without schema).
        body: the text between its dollar quotes (what ``pg_proc.prosrc`` holds).
        language, volatility, security_definer, strict, config: its options, as ``pg_proc``
            stores them (volatility ``i``/``s``/``v``; config ``name=value`` entries).
    """

    name: str
    body: str
    language: str
    volatility: str
    security_definer: bool
    strict: bool
    config: tuple[str, ...]


def file_functions(text: str) -> list[FileFunction]:
    """The functions ``text`` creates (a function file with its parts expanded).

    Raises:
        ValueError: a CREATE FUNCTION without a dollar-quoted body (every function file has one).
    """
    found = []
    for match in _CREATE.finditer(text):
        quote = _QUOTE.search(text, match.end())
        if quote is None:
            raise ValueError(f"pgflow.{match['name']}: no dollar-quoted body")
        tag = quote["tag"]
        body_start = quote.end()
        body_end = text.index(tag, body_start)
        header = text[match.end():quote.start()]
        options = " ".join(header.split()).upper()
        language = re.search(r"\bLANGUAGE\s+(\w+)", options)
        volatility = next((code for word, code in _VOLATILITY.items() if re.search(rf"\b{word}\b", options)), "v")
        config = tuple(f"{m['name']}={_unquote(m['value'])}" for m in _SET.finditer(header))
        found.append(FileFunction(
            name=match["name"], body=text[body_start:body_end],
            language=language.group(1).lower() if language else "sql", volatility=volatility,
            security_definer=bool(re.search(r"\bSECURITY\s+DEFINER\b", options)),
            strict=bool(re.search(r"\bSTRICT\b|\bRETURNS\s+NULL\s+ON\s+NULL\s+INPUT\b", options)),
            config=config,
        ))
    return found


def _unquote(value: str) -> str:
    """A ``SET`` value as ``pg_proc.proconfig`` stores it: ``''`` -> ``""`` (an empty search path)."""
    if value.startswith("'") and value.endswith("'"):
        inner = value[1:-1]
        return '""' if inner == "" else inner
    return value


@dataclass(frozen=True)
class FunctionDrift:
    """A function file compared with the catalog.

    Attributes:
        path: the file below ``sql/``.
        state: ``current`` (every function it creates is installed as written), ``differs``
            (a function of that name is installed with another body or other options) or
            ``missing`` (no function of that name is installed).
        detail: what differs, one sentence per function.
    """

    path: str
    state: str
    detail: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "state": self.state, "detail": list(self.detail)}


def function_drift(conn: psycopg.Connection, paths: Sequence[str], optional: Sequence[str] = ()) -> list[FunctionDrift]:
    """Compare the functions of ``paths`` (files below ``sql/``) with the catalog (read-only).

    A file function matches an installed function of the same name whose body is the text between
    its dollar quotes and whose language, volatility, security, strictness and settings are the
    ones it states (overloads are told apart by their bodies).

    Args:
        conn: a connection to the database.
        paths: the function files to compare.
        optional: those of ``paths`` installed on request only: not installed is not drift.

    Returns:
        One :class:`FunctionDrift` per file that creates a function, in ``paths`` order.
    """
    installed: dict[str, list[dict[str, Any]]] = {}
    with conn.cursor(row_factory=dict_row) as cur:
        for row in cur.execute(sqlfiles.statement(QUERIES, "function_definitions")).fetchall():
            installed.setdefault(row["name"], []).append(row)
    out = []
    for path in paths:
        wanted = file_functions(sqlfiles.load(path))
        if not wanted:
            continue
        problems, missing = [], 0
        for function in wanted:
            rows = installed.get(function.name, [])
            if not rows:
                missing += 1
                problems.append(f"pgflow.{function.name} is not installed")
                continue
            same_body = [r for r in rows if r["body"] == function.body]
            if not same_body:
                problems.append(f"pgflow.{function.name}: the installed body differs from the file's")
                continue
            options = [r for r in same_body if _same_options(r, function)]
            if not options:
                row = same_body[0]
                problems.append(f"pgflow.{function.name}({row['arguments']}): options differ (installed "
                                f"{_describe(row)}, file {_describe_file(function)})")
        if missing == len(wanted) and path in optional:
            continue
        state = "current" if not problems else "missing" if missing == len(wanted) else "differs"
        out.append(FunctionDrift(path, state, tuple(problems)))
    return out


def _same_options(row: Mapping[str, Any], function: FileFunction) -> bool:
    return (row["language"] == function.language and row["volatility"] == function.volatility
            and row["security_definer"] == function.security_definer and row["strict"] == function.strict
            and tuple(row["config"]) == function.config)


def _describe(row: Mapping[str, Any]) -> str:
    return (f"{row['language']} {row['volatility']}{' security definer' if row['security_definer'] else ''}"
            f"{' strict' if row['strict'] else ''} {list(row['config'])}")


def _describe_file(function: FileFunction) -> str:
    return (f"{function.language} {function.volatility}{' security definer' if function.security_definer else ''}"
            f"{' strict' if function.strict else ''} {list(function.config)}")

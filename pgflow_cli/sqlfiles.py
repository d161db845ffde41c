"""Load the authoritative SQL shipped with the package.

SQL lives in ``sql/`` at the repository root and ships inside the wheel as
``pgflow_cli/sql``. Python never builds SQL by pasting values into text; it only
reads these files. Two small, static directives keep one copy of each rule:

``--@include <relative path>``
    on a line of its own: replaced by the text of that file (recursively, cycles
    rejected). The migrations and the audit include ``fragments/*.sql`` so the slug
    and queue-name rules exist exactly once.

``--@name <identifier>`` / ``--@end``
    split a file into named statements (the audit file is one psql script holding
    several statements; Python runs them one by one by name).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

_INCLUDE = re.compile(r"^[ \t]*--@include[ \t]+(?P<path>[A-Za-z0-9_./-]+)[ \t]*$", re.MULTILINE)
_NAME = re.compile(r"^--@name[ \t]+(?P<name>[a-z_][a-z0-9_]*)[ \t]*$")
_END = re.compile(r"^--@end[ \t]*$")


def sql_root() -> Path:
    """Directory holding the SQL files: the installed ``pgflow_cli/sql`` or the checkout's ``sql/``."""
    packaged = resources.files("pgflow_cli").joinpath("sql")
    if packaged.is_dir():
        return Path(str(packaged))
    checkout = Path(__file__).resolve().parent.parent / "sql"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError("pgflow-cli's SQL files are missing: reinstall the package")


@lru_cache(maxsize=None)
def load(relative: str) -> str:
    """Return the text of ``sql/<relative>`` with every ``--@include`` expanded.

    Args:
        relative: path below ``sql/``, e.g. ``"migrations/0001_baseline_schema.sql"``.

    Raises:
        FileNotFoundError: the file or an included file does not exist.
        ValueError: an include cycle or a path escaping ``sql/``.
    """
    return _expand(relative, ())


def _expand(relative: str, stack: tuple[str, ...]) -> str:
    if relative in stack:
        raise ValueError(f"include cycle: {' -> '.join(stack + (relative,))}")
    root = sql_root()
    path = (root / relative).resolve()
    if root.resolve() not in path.parents:
        raise ValueError(f"include path escapes sql/: {relative}")
    text = path.read_text(encoding="utf-8")

    def replace(match: re.Match[str]) -> str:
        return _expand(match.group("path"), stack + (relative,)).rstrip("\n")

    return _INCLUDE.sub(replace, text)


def checksum(text: str) -> str:
    """SHA-256 hex digest of SQL text as it is executed (after include expansion)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class NamedStatement:
    """One ``--@name`` section of a SQL file.

    Attributes:
        name: the section name.
        sql: the statement text without its trailing semicolon.
    """

    name: str
    sql: str


@lru_cache(maxsize=None)
def named_statements(relative: str) -> dict[str, NamedStatement]:
    """Split ``sql/<relative>`` (after include expansion) into its named statements.

    Text outside sections (psql meta-commands, ``BEGIN``/``ROLLBACK`` for psql users)
    is ignored. Each section runs until the next ``--@name`` or ``--@end``.

    Raises:
        ValueError: a duplicate section name.
    """
    sections: dict[str, NamedStatement] = {}
    current: str | None = None
    lines: list[str] = []

    def close() -> None:
        if current is None:
            return
        body = "\n".join(lines).strip()
        body = body[:-1].rstrip() if body.endswith(";") else body
        if current in sections:
            raise ValueError(f"{relative}: duplicate section {current!r}")
        sections[current] = NamedStatement(current, body)

    for line in load(relative).splitlines():
        name_match = _NAME.match(line)
        if name_match or _END.match(line):
            close()
            current = name_match.group("name") if name_match else None
            lines = []
            continue
        if current is not None:
            lines.append(line)
    close()
    return sections


def statement(relative: str, name: str) -> str:
    """Text of one named statement of ``sql/<relative>``.

    Raises:
        KeyError: no section of that name.
    """
    return named_statements(relative)[name].sql

"""Load the authoritative SQL shipped with the package.

SQL lives in ``sql/`` at the repository root and ships inside the wheel as
``pgflow_cli/sql``. Python never builds SQL by pasting values into text; it only
reads these files. Migrations (``sql/migrations``) are literal: read with :func:`read_file`,
executed as written. Other files may use two small, static directives:

``--@include <relative path> [NAME=VALUE ...]``
    on a line of its own: replaced by the whole text of that file (recursively, cycles
    rejected): the ``parts/`` a function file shares with another, and the fragments the
    queries and the audit share (``fragments/*.sql``, ``audit/*.sql``), so the slug and
    queue-name rules exist exactly once. ``NAME=VALUE``: every ``{{NAME}}`` in the included
    text becomes ``VALUE`` (a shared part that differs only by a name, e.g. the function whose
    parameters it reads). The indentation of the directive line is not kept: the included
    text brings its own.

``--@name <identifier>`` / ``--@end``
    split a file into named statements (the audit file is one psql script holding
    several statements; Python runs them one by one by name).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

INCLUDE = re.compile(
    r"^[ \t]*--@include[ \t]+(?P<path>[A-Za-z0-9_./-]+)(?P<options>(?:[ \t]+[^ \t\n]+)*)[ \t]*$", re.MULTILINE
)
_SETTING = re.compile(r"^(?P<name>[a-z_][a-z0-9_]*)=(?P<value>[A-Za-z0-9_.]+)$")
_PLACEHOLDER = re.compile(r"\{\{(?P<name>[a-z_][a-z0-9_]*)\}\}")
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


@cache
def load(relative: str) -> str:
    """Return the text of ``sql/<relative>`` with every ``--@include`` expanded.

    Args:
        relative: path below ``sql/``, e.g. ``"queries/status.sql"``.

    Raises:
        FileNotFoundError: the file or an included file does not exist.
        ValueError: an include cycle, a path escaping ``sql/``, or a placeholder without a value.
    """
    return _expand(relative, ())


def read_file(relative: str) -> str:
    """The text of ``sql/<relative>`` as written (no directive expanded).

    Raises:
        FileNotFoundError: no such file.
        ValueError: a path escaping ``sql/``.
    """
    root = sql_root()
    path = (root / relative).resolve()
    if root.resolve() not in path.parents:
        raise ValueError(f"include path escapes sql/: {relative}")
    return path.read_text(encoding="utf-8")


def _expand(relative: str, stack: tuple[str, ...]) -> str:
    """The text of ``relative`` with its includes expanded (``stack``: the include chain above it)."""
    stack = stack + (relative,)

    def replace(match: re.Match[str]) -> str:
        target = match.group("path")
        if target in stack:
            raise ValueError(f"include cycle: {' -> '.join(stack + (target,))}")
        settings: dict[str, str] = {}
        for option in match.group("options").split():
            setting = _SETTING.match(option)
            if setting is None:
                raise ValueError(f"{relative}: unknown --@include option {option!r} (only NAME=VALUE)")
            settings[setting["name"]] = setting["value"]
        included = _expand(target, stack).rstrip("\n")

        def fill(placeholder: re.Match[str]) -> str:
            if placeholder["name"] not in settings:
                raise ValueError(f"{relative}: {target} needs {placeholder['name']}=... on its --@include line")
            return settings[placeholder["name"]]

        return _PLACEHOLDER.sub(fill, included)

    return INCLUDE.sub(replace, read_file(relative))


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


@cache
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

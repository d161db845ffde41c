"""Load the authoritative SQL shipped with the package.

SQL lives in ``sql/`` at the repository root and ships inside the wheel as
``pgflow_cli/sql``. Python never builds SQL by pasting values into text; it only
reads these files. Two small, static directives keep one copy of each rule:

``--@include <relative path> [lines=A-B] [NAME=VALUE ...] [as-create]``
    on a line of its own: replaced by the text of that file (recursively, cycles
    rejected). The migrations include the one file of each function
    (``functions/<area>/<name>.sql``), and the migrations and the audit include
    ``fragments/*.sql`` so the slug and queue-name rules exist exactly once. Options:

    * ``lines=A-B``: only lines A to B of the file (1-based, inclusive, as written);
      how a released older version of a function reuses the unchanged lines of the
      current file (``sql/baseline``, ``sql/released``);
    * ``NAME=VALUE``: every ``{{NAME}}`` in the included text becomes ``VALUE`` (a shared
      part that differs only by a name, e.g. the function whose parameters it reads);
    * ``as-create``: ``CREATE OR REPLACE FUNCTION|TRIGGER|VIEW`` is written ``CREATE ...``,
      the spelling of the released migrations 0001-0003, whose text stays byte for byte
      what they executed when they were released.

    The indentation of the directive line is not kept: the included text brings its own.

``--@note <text>``
    a line of its own that is dropped when the file is expanded: a comment for the reader
    of a file whose executed text must not change (a shared part, a released version).

``--@name <identifier>`` / ``--@end``
    split a file into named statements (the audit file is one psql script holding
    several statements; Python runs them one by one by name).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

INCLUDE = re.compile(
    r"^[ \t]*--@include[ \t]+(?P<path>[A-Za-z0-9_./-]+)(?P<options>(?:[ \t]+[^ \t\n]+)*)[ \t]*$", re.MULTILINE
)
_LINES = re.compile(r"^(?P<first>[1-9][0-9]*)-(?P<last>[1-9][0-9]*)$")
_SETTING = re.compile(r"^(?P<name>[a-z_][a-z0-9_]*)=(?P<value>[A-Za-z0-9_.]+)$")
_PLACEHOLDER = re.compile(r"\{\{(?P<name>[a-z_][a-z0-9_]*)\}\}")
NOTE = re.compile(r"^[ \t]*--@note\b[^\n]*(?:\n|$)", re.MULTILINE)
_OR_REPLACE = re.compile(r"^CREATE OR REPLACE (?=FUNCTION |TRIGGER |VIEW )", re.MULTILINE)
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
        relative: path below ``sql/``, e.g. ``"migrations/0001_baseline_schema.sql"``.

    Raises:
        FileNotFoundError: the file or an included file does not exist.
        ValueError: an include cycle or a path escaping ``sql/``.
    """
    return _expand(relative, (), read_file)


Reader = Callable[[str], str]
"""Returns the written text of a file below ``sql/`` (the tree by default; a git revision in sqlfreeze)."""


def expand(text: str, *, origin: str = "(text)", read: Reader | None = None) -> str:
    """Expand the directives of ``text`` as if it were a file named ``origin`` (not cached).

    Args:
        text: SQL text, e.g. one ``--@include`` line.
        origin: the name used in messages and for include-cycle detection.
        read: where included files are read from (default: the tree, :func:`read_file`).
    """
    return _expand_text(origin, text, (origin,), read or read_file)


def _expand(relative: str, stack: tuple[str, ...], read: Reader) -> str:
    return _expand_text(relative, read(relative), stack + (relative,), read)


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


def _expand_text(relative: str, text: str, stack: tuple[str, ...], read: Reader) -> str:
    """Expand the directives of ``text`` (the text of ``relative``; ``stack``: the include chain)."""

    def replace(match: re.Match[str]) -> str:
        target = match.group("path")
        if target in stack:
            raise ValueError(f"include cycle: {' -> '.join(stack + (target,))}")
        options = match.group("options").split()
        lines: tuple[int, int] | None = None
        settings: dict[str, str] = {}
        as_create = False
        for option in options:
            if option == "as-create":
                as_create = True
            elif option.startswith("lines="):
                span = _LINES.match(option[len("lines="):])
                if not span or int(span["first"]) > int(span["last"]):
                    raise ValueError(f"{relative}: bad line range {option!r}")
                lines = (int(span["first"]), int(span["last"]))
            elif _SETTING.match(option):
                setting = _SETTING.match(option)
                assert setting is not None
                settings[setting["name"]] = setting["value"]
            else:
                raise ValueError(f"{relative}: unknown --@include option {option!r}")
        if lines is None:
            included = _expand(target, stack, read).rstrip("\n")
        else:
            written = read(target).split("\n")
            if lines[1] > len(written):
                raise ValueError(f"{relative}: {target} has no line {lines[1]}")
            included = _expand_text(target, "\n".join(written[lines[0] - 1:lines[1]]), stack + (target,), read)
        if settings or _PLACEHOLDER.search(included):
            def fill(placeholder: re.Match[str]) -> str:
                if placeholder["name"] not in settings:
                    raise ValueError(f"{relative}: {target} needs {placeholder['name']}=... on its --@include line")
                return settings[placeholder["name"]]

            included = _PLACEHOLDER.sub(fill, included)
        if as_create:
            included = _OR_REPLACE.sub("CREATE ", included)
        return included

    return INCLUDE.sub(replace, NOTE.sub("", text))


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

"""Rendering of reports: rich tables for people, JSON and CSV for automation.

Data goes to stdout; progress, warnings and errors go to stderr (DESIGN.md).
Every value shown in a table passes through :func:`display`, which escapes control
characters and never interprets rich markup, so a hostile slug or queue name cannot
move the cursor, clear the screen or fake table rows.
"""

from __future__ import annotations

import csv
import datetime as _dt
import decimal
import io
import json
import sys
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

JSON_FORMATS = ("table", "json", "csv")

_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\e"}


def display(value: Any) -> str:
    """Printable form of a value: control and invisible format characters escaped.

    ``None`` becomes ``""``; non-text values use ``str()``. Escapes are ``\\n``,
    ``\\t``, ``\\r``, ``\\e`` and ``\\xNN``/``\\uNNNN`` for other control characters.
    """
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        elif 0x80 <= ord(ch) < 0xA0 or ch in "\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\ufeff":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def text(value: Any, style: str | None = None) -> Text:
    """A rich :class:`Text` with markup disabled and control characters escaped."""
    return Text(display(value), style=style or "")


def stdout_console() -> Console:
    """Console for data (stdout). Colour only on a terminal; never wraps data into markup.

    Off a terminal (pipes, CI logs) tables get ``$COLUMNS`` or 160 columns instead of rich's 80,
    so they are not squeezed into unreadable cells.
    """
    width = None
    if not sys.stdout.isatty():
        import os

        width = int(os.environ.get("COLUMNS", "0") or 0) or 160
    return Console(file=sys.stdout, highlight=False, soft_wrap=False, width=width)


def stderr_console() -> Console:
    """Console for progress, warnings and errors (stderr)."""
    return Console(file=sys.stderr, highlight=False, soft_wrap=True)


def _json_default(value: Any) -> Any:
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if hasattr(value, "to_dict"):
        return value.to_dict()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def to_json(document: Mapping[str, Any]) -> str:
    """Serialise a report document (datetimes ISO 8601, UUIDs as text, sorted keys off)."""
    return json.dumps(document, indent=2, default=_json_default, ensure_ascii=False)


def write_json(document: Mapping[str, Any]) -> None:
    """Write a JSON document to stdout, newline-terminated."""
    sys.stdout.write(to_json(document) + "\n")
    sys.stdout.flush()


def write_csv(columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> None:
    """Write rows as CSV with a header to stdout; lists and dicts become JSON text."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_csv_cell(row.get(column)) for column in columns])
    sys.stdout.write(buffer.getvalue())
    sys.stdout.flush()


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=_json_default, ensure_ascii=False)
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    return value

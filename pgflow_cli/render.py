"""Rendering of reports: rich tables for people, tabulate text for pipes and tickets, JSON and
CSV for automation (docs/commands/README.md "Output formats").

Data goes to stdout; progress, warnings and errors go to stderr (DESIGN.md).
Every value shown in a table passes through :func:`display`, which escapes control
characters and never interprets rich markup, so a hostile slug or queue name cannot
move the cursor, clear the screen or fake table rows.

* ``table``: rich, the default on a terminal; ``NO_COLOR`` or a non-terminal stdout gives no escape
  code at all; too narrow a terminal leaves out the least useful columns (:class:`Column.drop`)
  and wraps text columns, never a state word.
* ``plain``: :func:`tabulate` ``plain`` tables, no trailing spaces, the default when stdout is not a
  terminal; ``markdown``: the same as a Markdown document (pipe tables).
* a stdout that cannot encode Unicode (``PYTHONIOENCODING=ascii``) gets ASCII: see :func:`ascii_only`.
"""

from __future__ import annotations

import csv
import datetime as _dt
import decimal
import io
import json
import os
import sys
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich is imported where a rich object is made: plain, markdown, JSON and CSV need none of it
    from rich.console import Console
    from rich.text import Text

JSON_FORMATS = ("table", "json", "csv")
TEXT_FORMATS = ("table", "plain", "markdown")
"""Formats for people: one report, three renderings (rich; tabulate plain; Markdown)."""

UNKNOWN = "unknown (not analysed)"
"""What a table shows for a value that was not measured (never ``?``)."""

_ASCII_FALLBACK = str.maketrans({
    "\u00b7": "-", "\u2192": "->", "\u2190": "<-", "\u2014": "-", "\u2013": "-", "\u2026": "...",
    "\u2265": ">=", "\u2264": "<=", "\u00d7": "x", "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"',
    "\u2713": "ok", "\u2717": "x",
})

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
    shown = "".join(out)
    return shown.translate(_ASCII_FALLBACK) if ascii_only() else shown


def age(seconds: float | None, *, minutes_in_hours: bool = False) -> str:
    """A rough duration for a table cell: ``42 s`` below two minutes, ``7 min`` below two hours, then
    ``3 h`` (``3 h 12 min`` with ``minutes_in_hours``); ``-`` for None. Whole units, rounded down.

    Args:
        seconds: the duration in seconds, or None when there is none.
        minutes_in_hours: also show the minutes past the hour.
    """
    if seconds is None:
        return "-"
    whole = int(seconds)
    if whole < 120:
        return f"{whole} s"
    if whole < 7200:
        return f"{whole // 60} min"
    return f"{whole // 3600} h {whole % 3600 // 60} min" if minutes_in_hours else f"{whole // 3600} h"


def span(seconds: float | None, *, compact: bool = False) -> str:
    """A duration as its largest whole unit and the next: ``3 d 4 h``, ``2 h 5 min``, ``7 min 30 s``,
    ``12 s``; ``compact``: ``3d 4h``, ``2h 5m``, ``7m 30s``, ``12s``. Rounded down to the second; ``""``
    for None.

    Args:
        seconds: the duration in seconds (0 or more), or None when there is none.
        compact: the short spelling, for narrow columns.
    """
    if seconds is None:
        return ""
    whole = int(seconds)
    values = (whole // 86400, whole % 86400 // 3600, whole % 3600 // 60, whole % 60)
    units = ("d", "h", "m", "s") if compact else ("d", "h", "min", "s")
    first = next((index for index, value in enumerate(values) if value), len(values) - 1)
    return " ".join(f"{values[index]}{'' if compact else ' '}{units[index]}"
                    for index in range(first, min(first + 2, len(values))))


def size(value: int) -> str:
    """A byte count for a table cell: ``812 B``, then one decimal in the largest binary unit below
    1024 (``1.5 kB``, ``12.0 MB``, ... ``TB``).

    Args:
        value: bytes (0 or more).
    """
    amount = float(value)
    for unit in ("B", "kB", "MB", "GB"):
        if amount < 1024:
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} TB"


def ascii_only(stream: Any = None) -> bool:
    """True when ``stream`` (default stdout) cannot encode Unicode: ASCII borders and punctuation then,
    and ``\\xNN`` escapes for other characters (the CLI sets ``errors="backslashreplace"``)."""
    encoding = getattr(stream or sys.stdout, "encoding", None) or "utf-8"
    return not encoding.lower().replace("_", "-").startswith("utf")


def no_color() -> bool:
    """``NO_COLOR`` is set to a non-empty value (https://no-color.org): no escape codes at all."""
    return bool(os.environ.get("NO_COLOR"))


def stdout_is_terminal() -> bool:
    """Whether stdout is a terminal (``table`` is then the default format, else ``plain``)."""
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def text(value: Any, style: str | None = None) -> Text:
    """A rich :class:`Text` with markup disabled and control characters escaped."""
    from rich.text import Text

    return Text(display(value), style=style or "")


def stdout_console() -> Console:
    """Console for data (stdout). Colour only on a terminal; never wraps data into markup.

    Off a terminal (pipes, CI logs) tables get ``$COLUMNS`` or 160 columns instead of rich's 80,
    so they are not squeezed into unreadable cells.
    """
    from rich.console import Console

    width = None
    file: Any = sys.stdout
    if not stdout_is_terminal():
        width = int(os.environ.get("COLUMNS", "0") or 0) or 160
        file = _TrailingSpaceStripper(sys.stdout)
    return Console(file=file, highlight=False, soft_wrap=False, width=width,
                   color_system=None if no_color() else "auto", emoji=False)


class _TrailingSpaceStripper:
    """A text stream that drops the spaces rich pads lines with (off a terminal: no trailing padding)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.encoding = getattr(stream, "encoding", "utf-8")
        self._pending = ""

    def isatty(self) -> bool:
        return False

    def write(self, data: str) -> int:
        lines = (self._pending + data).split("\n")
        self._pending = lines.pop()
        if lines:
            self.stream.write("".join(line.rstrip(" ") + "\n" for line in lines))
        return len(data)

    def flush(self) -> None:
        if self._pending:
            self.stream.write(self._pending)
            self._pending = ""
        self.stream.flush()


def stderr_console() -> Console:
    """Console for progress, warnings and errors (stderr); ``NO_COLOR`` removes every escape code."""
    from rich.console import Console

    return Console(file=sys.stderr, highlight=False, soft_wrap=True, color_system=None if no_color() else "auto",
                   emoji=False)


@dataclass(frozen=True)
class Column:
    """One column of a report table.

    Attributes:
        key: the row dictionary's key.
        header: the heading shown.
        drop: 0 never left out; otherwise the column is left out when the terminal is too narrow,
            highest ``drop`` first (``table`` format only; ``plain``/``markdown`` show every column).
        wrap: long text that may wrap over several lines (else the column is never cut or wrapped,
            as a state word must not be).
        justify: ``left`` or ``right``.
    """

    key: str
    header: str
    drop: int = 0
    wrap: bool = False
    justify: str = "left"


Styler = Callable[[str, Mapping[str, Any]], "str | None"]
"""``style(column_key, row)`` -> a rich style for that cell in the ``table`` format, or ``None``."""


class Page:
    """One report written in a text format (``table``, ``plain``, ``markdown``) to stdout.

    Commands describe their report once, as lines and tables; the page renders them for a terminal
    (rich, styled), for pipes (plain text, no escape codes, no trailing spaces) or for a ticket
    (Markdown).

    Args:
        output_format: ``table``, ``plain`` or ``markdown`` (anything else is treated as ``plain``).
        console: the rich console for ``table`` (default :func:`stdout_console`).
    """

    def __init__(self, output_format: str, console: Console | None = None) -> None:
        self.format = output_format if output_format in TEXT_FORMATS else "plain"
        self.console = console or stdout_console() if self.format == "table" else None
        self._plain_console: Console | None = None

    def print(self, renderable: Any = "") -> None:
        """Print any rich renderable (a :class:`Text`, a ``Padding``...): styled on a terminal in
        ``table``; elsewhere without escape codes and with each line's trailing spaces removed."""
        if self.console is not None and stdout_is_terminal():
            self.console.print(renderable)
            return
        console = self.console
        if console is None:
            if self._plain_console is None:
                from rich.console import Console

                self._plain_console = Console(file=sys.stdout, highlight=False, soft_wrap=False, width=self.width,
                                              color_system=None, emoji=False)
            console = self._plain_console
        with console.capture() as captured:
            console.print(renderable)
        for out in captured.get().splitlines():
            if self.format == "markdown":
                self.line(out)
            else:
                self._write(out)

    @property
    def width(self) -> int:
        """Columns available: the terminal's (or ``$COLUMNS``, else 160 off a terminal)."""
        if self.console is not None:
            return int(self.console.width)
        return int(os.environ.get("COLUMNS", "0") or 0) or 160

    def _write(self, line: str) -> None:
        sys.stdout.write(line.rstrip() + "\n")

    def line(self, value: Any = "", style: str | None = None) -> None:
        """One line of prose (a sentence, a ``next:`` hint); styled only in ``table``."""
        if self.console is not None:
            self.print(text(value, style))
        elif self.format == "markdown":
            shown = display(value)
            stripped = shown.lstrip()
            self._write(("- " + stripped) if stripped and stripped != shown else shown)
            if stripped == shown:
                self._write("")
        else:
            self._write(display(value))

    def heading(self, value: Any) -> None:
        """A section title: bold in ``table``, ``## title`` in ``markdown``, the bare line in ``plain``."""
        if self.console is not None:
            self.print(text(value, "bold"))
        elif self.format == "markdown":
            self._write(f"## {display(value)}")
            self._write("")
        else:
            self._write(display(value))

    def blank(self) -> None:
        """An empty line (kept out of Markdown, whose blocks already end with one)."""
        if self.format != "markdown":
            self._write("")

    def table(self, columns: Sequence[Column], rows: Sequence[Mapping[str, Any]], *, title: str | None = None,
              style: Styler | None = None) -> list[str]:
        """Render rows; returns the headers of the columns left out for width (``table`` only).

        Each cell is shown as :func:`display` of the row's value (``None``: empty). In ``table``,
        when the columns do not fit the width, the columns with the highest :attr:`Column.drop`
        are left out first and a line says which; wrap columns fold at spaces.
        """
        cells = [{c.key: display(row.get(c.key)) for c in columns} for row in rows]
        if self.console is None:
            from tabulate import tabulate  # type: ignore[import-untyped]  # no stubs; returns str

            headers = [c.header for c in columns]
            data = [[cell[c.key] for c in columns] for cell in cells]
            if self.format == "markdown":
                if title:
                    self._write(f"**{display(title)}**")
                    self._write("")
                data = [[value.replace("|", "\\|") for value in row] for row in data]
                body = tabulate(data, headers=headers, tablefmt="github", disable_numparse=True) if data else \
                    "| " + " | ".join(headers) + " |\n|" + "|".join("---" for _ in headers) + "|"
            else:
                if title:
                    self._write(display(title))
                body = tabulate(data, headers=headers, tablefmt="plain", disable_numparse=True)
            for out in body.splitlines():
                self._write(out)
            if self.format == "markdown":
                self._write("")
            return []
        from rich.table import Table
        from rich.text import Text

        shown = fit_columns(columns, cells, self.width)
        dropped = [c.header for c in columns if c not in shown]
        table = Table(title=display(title) if title else None, title_justify="left", title_style="bold")
        for c in shown:
            table.add_column(c.header, no_wrap=not c.wrap, overflow="fold", justify=c.justify)  # type: ignore[arg-type]
        for row, cell in zip(rows, cells, strict=True):
            table.add_row(*(Text(cell[c.key], style=(style(c.key, row) if style else None) or "") for c in shown))
        self.print(table)
        if dropped:
            self.print(text(f"(left out at {self.width} columns: {', '.join(dropped)}; "
                                    "--format plain shows every column)", "dim"))
        return dropped


def fit_columns(columns: Sequence[Column], cells: Sequence[Mapping[str, str]], width: int) -> list[Column]:
    """The columns that fit ``width`` in a rich box table, leaving out the highest ``drop`` first.

    A no-wrap column needs its longest value; a wrap column needs its longest word (at least 10
    columns, at most its longest value). Each column adds 3 for padding and its border.
    """

    def need(c: Column) -> int:
        values = [cell[c.key] for cell in cells] + [c.header]
        if not c.wrap:
            return max(len(v) for v in values)
        longest_word = max((len(word) for v in values for word in v.split()), default=0)
        return min(max(len(v) for v in values), max(10, longest_word, len(c.header)))

    shown = list(columns)
    while sum(need(c) + 3 for c in shown) + 1 > width:
        candidates = [c for c in shown if c.drop]
        if not candidates:
            break
        shown.remove(max(candidates, key=lambda c: (c.drop, shown.index(c))))
    return shown


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


def to_json(document: Mapping[str, Any], *, ensure_ascii: bool = False) -> str:
    """Serialise a report document (datetimes ISO 8601, UUIDs as text, sorted keys off;
    ``ensure_ascii``: non-ASCII characters as ``\\uNNNN`` escapes, still valid JSON)."""
    return json.dumps(document, indent=2, default=_json_default, ensure_ascii=ensure_ascii)


def write_json(document: Mapping[str, Any], *, compact: bool = False) -> None:
    """Write a JSON document to stdout, newline-terminated (ASCII escapes on an ASCII stdout);
    ``compact``: on one line (one document per line, for ``--watch``)."""
    text = to_json(document, ensure_ascii=ascii_only())
    if compact:
        text = json.dumps(json.loads(text), ensure_ascii=ascii_only(), separators=(",", ":"))
    sys.stdout.write(text + "\n")
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
    if isinstance(value, bool):  # as in JSON
        return "true" if value else "false"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=_json_default, ensure_ascii=False)
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    return value

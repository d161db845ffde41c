"""Output formats of ``pgflow status`` and ``pgflow runs`` (table, plain, markdown, json).

Interim home, kept small on purpose: these few functions are what switches to the shared rendering
machinery of issue 16 (docs/commands/README.md) when it lands. Until then: ``table`` is a rich
table (default on a terminal), ``plain`` a ``tabulate`` plain table without colour or trailing
spaces (default when stdout is not a terminal), ``markdown`` pipe tables, ``json`` one document.
"""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Sequence
from typing import Annotated, Any, Optional

import typer
from rich import box
from rich.table import Table
from tabulate import tabulate  # type: ignore[import-untyped]

from pgflow_cli import __version__, db, render


class ReportFormat(str, enum.Enum):
    """``--format`` of status and runs."""

    table = "table"
    plain = "plain"
    markdown = "markdown"
    json = "json"


ReportFormatOption = Annotated[
    Optional[ReportFormat],
    typer.Option("--format", "-f", case_sensitive=False, show_default=False,
                 help="table (default on a terminal), plain (default when piped), markdown, json (versioned document)."),
]


def chosen(fmt: ReportFormat | None) -> ReportFormat:
    """The format to use: the one given, else ``table`` on a terminal and ``plain`` otherwise."""
    if fmt is not None:
        return fmt
    return ReportFormat.table if sys.stdout.isatty() else ReportFormat.plain


def write_table(fmt: ReportFormat, title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]],
                drop_order: Sequence[str] = ()) -> None:
    """One table on stdout in ``fmt`` (not json); every cell passes through :func:`render.display`.

    The rich table (``table``) leaves out the ``drop_order`` columns, in that order, while it is wider
    than the console, and says which; a name column folds, the others are never cut. ``plain`` and
    ``markdown`` never leave out a column.
    """
    cells = [[render.display(c) for c in row] for row in rows]
    if fmt == ReportFormat.table:
        console = render.stdout_console()
        for dropped in range(len(drop_order) + 1):
            keep = [i for i, h in enumerate(headers) if h not in drop_order[:dropped]]
            table = _rich_table(title, headers, cells, keep)
            if console.measure(table, options=console.options.update_width(10_000)).minimum <= console.width:
                break
        console.print(table)
        if len(keep) < len(headers):
            left_out = ", ".join(h for i, h in enumerate(headers) if i not in keep)
            console.print(render.text(f"(columns left out at {console.width} columns: {left_out})", "dim"))
        return
    style = "github" if fmt == ReportFormat.markdown else "plain"
    heading = f"### {title}" if fmt == ReportFormat.markdown else title
    body = tabulate(cells, headers=list(headers), tablefmt=style, disable_numparse=True) if cells else "(none)"
    write_lines([heading, "", body, ""] if fmt == ReportFormat.markdown else [heading, body])


def _rich_table(title: str, headers: Sequence[str], cells: Sequence[Sequence[str]], keep: Sequence[int]) -> Table:
    table = Table(title=render.text(title, "bold"), box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0),
                  pad_edge=False)
    for i in keep:
        longest = max((len(row[i]) for row in cells), default=0)
        table.add_column(headers[i], overflow="fold", min_width=min(longest, 16) if i == 0 else None,
                         no_wrap=i > 0 and headers[i] not in ("workers", "error", "output"))
    for row in cells:
        table.add_row(*(render.text(row[i]) for i in keep))
    return table


def write_lines(lines: Sequence[str], style: str | None = None, fmt: ReportFormat = ReportFormat.plain) -> None:
    """Text lines on stdout: rich (styled) for ``table``, else plain text without trailing spaces."""
    if fmt == ReportFormat.table:
        console = render.stdout_console()
        for line in lines:  # wrapped to the width, except a command to paste (the terminal wraps it)
            console.print(render.text(line, style), soft_wrap=line.startswith("next: "))
        return
    sys.stdout.write("".join(render.display(part).rstrip() + "\n" for line in lines for part in line.split("\n")))
    sys.stdout.flush()


def write_document(document: dict[str, Any], compact: bool = False) -> None:
    """A versioned JSON document on stdout (``compact``: one line, for ``--watch``)."""
    full = {"kind": document.pop("kind"), "version": document.pop("version"), "tool_version": __version__, **document}
    if compact:
        sys.stdout.write(json.dumps(json.loads(render.to_json(full)), ensure_ascii=False, separators=(",", ":")) + "\n")
        sys.stdout.flush()
    else:
        render.write_json(full)


def database(conn: Any, target: db.Target) -> dict[str, Any]:
    """The server actually connected to, read from the connection (docs/commands/README.md)."""
    info = conn.info
    return {"host": info.host, "port": info.port, "dbname": info.dbname, "user": info.user,
            "server_version_num": info.server_version, "source": target.source}


def target_args(dsn: str | None, sandbox: bool) -> str:
    """The target option to repeat in a ``next:`` line: ``--sandbox``, ``--dsn '<no password>'`` or nothing."""
    if sandbox:
        return " --sandbox"
    return f" --dsn '{db.redact(dsn, dsn)}'" if dsn else ""


def age(seconds: float | None) -> str:
    """A duration for people: ``42 s``, ``7 min``, ``3 h``; ``-`` for none."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    return f"{whole} s" if whole < 120 else f"{whole // 60} min" if whole < 7200 else f"{whole // 3600} h"

"""``pgflow status``: what runs, per flow (read-only; docs/commands/status.md)."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Mapping
from typing import Annotated

import typer

from pgflow_cli import db, render
from pgflow_cli.cli import common
from pgflow_cli.cli.common import OutputFormat
from pgflow_cli.errors import ExitCode, UsageError
from pgflow_cli.operations import status as status_op
from pgflow_cli.operations.coverage import DEFAULT_HEARTBEAT_WINDOW

HELP = """What runs, per flow, in one read-only snapshot: runs by state, tasks by state, the oldest
queued task and how long it has waited, stalled tasks (what the next pgflow.requeue_stalled_tasks()
call would take back, and tasks it gave up on), each queue's backlog (what pgmq.metrics() reports, counted
from the queue's own table; plain flow queues and private step queues) and the workers (live, deprecated, stale).

--watch redraws every 2 seconds, or every --interval SECONDS, until Ctrl-C (`--watch SECONDS` works
too); with --format json it writes one document per line. Read-only: SELECT on the pgflow and pgmq
tables suffices.

Exit 0: shown. Exit 3: cannot connect or no pgflow schema. Exit 6: a --flow that names no flow.
Exit 130: --watch stopped with Ctrl-C (the normal end of a watch).

\b
Examples:
  pgflow status
  pgflow status --flow orders --watch 5
  pgflow status --format json | jq .totals"""

WATCH_DEFAULT = 2.0
"""Seconds between the snapshots of ``--watch`` when no interval is given."""
WATCH_MINIMUM = 0.2
"""The shortest interval ``--watch`` accepts, in seconds."""


def watch_interval(watch: bool, seconds: float | None, interval: float | None) -> float | None:
    """The seconds between snapshots, or None for one snapshot, from ``--watch``, the number that may
    follow it (``--watch 5``, the form documented before ``--interval``) and ``--interval``.

    Args:
        watch: ``--watch`` was given.
        seconds: the SECONDS argument (``--watch 5``), or None.
        interval: ``--interval SECONDS``, or None.

    Returns:
        None without ``--watch``; else the interval given, or :data:`WATCH_DEFAULT`.

    Raises:
        UsageError: an interval without ``--watch``, or two intervals.
    """
    if not watch:
        if seconds is not None or interval is not None:
            value = seconds if seconds is not None else interval
            given = f"SECONDS {value:g}" if seconds is not None else f"--interval {value:g}"
            raise UsageError(f"{given} without --watch: an interval is for watching only",
                             hint=f"to redraw every {value:g} s: pgflow status --watch --interval {value:g}")
        return None
    if seconds is not None and interval is not None:
        raise UsageError("give the --watch interval once: --watch --interval SECONDS (or --watch SECONDS)")
    return next((value for value in (seconds, interval) if value is not None), WATCH_DEFAULT)


def register(app: typer.Typer) -> None:
    """Attach ``status`` to the root command."""
    app.command("status", help=HELP)(common.option_groups(status))


def status(
    flow: Annotated[str | None, typer.Option("--flow", metavar="SLUG", show_default=False,
                                                help="Only this flow (exact slug).")] = None,
    seconds: Annotated[float | None, typer.Argument(
        metavar="SECONDS", min=WATCH_MINIMUM, show_default=False,
        help="After --watch: the same as --interval SECONDS (`pgflow status --watch 5`).")] = None,
    watch: Annotated[bool, typer.Option(
        "--watch", help=f"Redraw every {WATCH_DEFAULT:g} seconds (or --interval) until Ctrl-C.")] = False,
    interval: Annotated[float | None, typer.Option(
        "--interval", metavar="SECONDS", min=WATCH_MINIMUM, show_default=False,
        help=f"Seconds between the snapshots of --watch (default {WATCH_DEFAULT:g}).")] = None,
    output_format: common.ReportFormatOption = OutputFormat.table,
    heartbeat_window: Annotated[float, typer.Option(
        "--heartbeat-window", min=0.1, metavar="SECONDS",
        help="A worker is live when its last heartbeat is at most this old (as `pgflow coverage`).")]
    = DEFAULT_HEARTBEAT_WINDOW,
    where: common.TargetOptions = common.ANY_TARGET,
) -> None:
    every = watch_interval(watch, seconds, interval)
    stop = threading.Event()
    with where.connected() as (conn, target):
        try:
            while True:
                report = status_op.collect(conn, flow, heartbeat_window=heartbeat_window)
                show(report, output_format, target, redraw=every is not None)
                if every is None or stop.wait(every):
                    return
        except KeyboardInterrupt:
            if every is None:
                raise
            render.stderr_console().print("stopped watching")
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None


FLOW_COLUMNS = (
    render.Column("flow", "flow"),
    render.Column("in_flight", "in flight", justify="right"),
    render.Column("failed", "failed", justify="right"),
    render.Column("queued", "queued", drop=2, justify="right"),
    render.Column("running", "running", drop=4, justify="right"),
    render.Column("waiting", "waiting", drop=3, justify="right"),
    render.Column("stalled", "stalled", wrap=True),
    render.Column("workers", "workers", drop=5, wrap=True),
    render.Column("waited", "waited", drop=6, justify="right"),
    render.Column("backlog", "backlog", drop=7, justify="right"),
    render.Column("done", "done", drop=8, justify="right"),
)
"""The per-flow table. What an operator looks for stays longest: the flow, runs in flight and failed,
stalled tasks, then queued tasks, manual tasks waiting for their outcome (never counted as running),
running tasks and the workers; too narrow a terminal leaves out done, backlog, waited, workers, running,
waiting and queued, in that order (and says so; the closing line keeps the totals)."""

QUEUE_COLUMNS = (
    render.Column("queue", "queue", wrap=True),
    render.Column("flow", "flow", wrap=True),
    render.Column("kind", "kind", drop=3),
    render.Column("messages", "messages", justify="right"),
    render.Column("visible", "visible", drop=2, justify="right"),
    render.Column("oldest", "oldest", drop=1, justify="right"),
)


def show(report: status_op.StatusReport, output_format: OutputFormat, target: db.Target,
         redraw: bool = False) -> None:
    """Render one snapshot: a versioned JSON document (one compact line per snapshot when ``redraw``,
    i.e. ``--watch``) or a :class:`render.Page` in ``table``/``plain``/``markdown``.

    Args:
        report: the snapshot (:func:`pgflow_cli.operations.status.collect`).
        output_format: any :class:`OutputFormat` but ``csv``.
        target: the connected target (the JSON ``database`` object).
        redraw: ``--watch``: clear a terminal before a ``table`` snapshot, compact JSON lines.
    """
    if output_format == OutputFormat.json:
        render.write_json(common.versioned(report.to_document(), target), compact=redraw)
        return
    page = render.Page(output_format.value)
    if redraw and page.console is not None and render.stdout_is_terminal():
        page.console.clear()
    page.table(FLOW_COLUMNS, [_flow_row(f) for f in report.flows], title=title(report, target),
               style=_style)
    queues = [q for f in report.flows for q in f.queues] + report.other_queues
    if queues:
        page.table(QUEUE_COLUMNS, [
            {"queue": q.queue_name + (f" (also {', '.join(q.aliases)})" if q.aliases else ""),
             "flow": q.flow_slug or "(no flow)", "kind": q.origin,
             "messages": "unknown (no table)" if q.messages is None else q.messages,
             "visible": "-" if q.visible is None else q.visible, "oldest": render.age(q.oldest_message_age_seconds)}
            for q in queues], title="queues (PGMQ metrics)")
    page.line(summary(report), "bold green" if not report.runs_in_flight else "bold")


def _flow_row(flow: status_op.FlowStatus) -> dict[str, object]:
    oldest = flow.oldest_queued
    stalled = (render.UNKNOWN if flow.stalled is None else str(flow.stalled)
               + (f" (+{flow.permanently_stalled} given up)" if flow.permanently_stalled else ""))
    workers = (render.UNKNOWN if flow.workers is None
               else ", ".join(f"{n} {kind}" for kind, n in flow.workers.items() if n) or "none")
    return {"flow": flow.flow_slug, "in_flight": flow.runs_in_flight, "done": flow.runs.get("completed", 0),
            "failed": flow.runs.get("failed", 0), "queued": flow.tasks.get("queued", 0),
            "running": flow.running, "waiting": "-" if flow.waiting is None else flow.waiting, "stalled": stalled,
            "waited": render.age(oldest.age_seconds) if oldest else "-", "backlog": flow.backlog, "workers": workers}


def _style(key: str, row: Mapping[str, object]) -> str | None:
    value = row.get(key)
    if key == "failed" and value:
        return "bold red"
    if key == "stalled" and value not in ("0", render.UNKNOWN):
        return "bold red"
    if key == "waiting" and value not in (0, "-"):
        return "yellow"
    if key == "workers" and "stale" in str(value):
        return "red"
    return None


def title(report: status_op.StatusReport, target: db.Target) -> str:
    """``pgflow status of user@host:port/dbname at 2026-12-01 10:20:30 UTC`` (the server's clock at
    the snapshot; with ``--flow``, the flow too): which database and when, also in every ``--watch`` redraw."""
    where = target.server.describe() if target.server else target.describe()
    when = report.checked_at.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    flow = f" (flow {report.flow_filter})" if report.flow_filter else ""
    return f"pgflow status of {where} at {when} UTC{flow}"


def summary(report: status_op.StatusReport) -> str:
    """The closing line, e.g. ``3 flow(s): no run in flight`` or ``... 2 run(s) in flight, 1 failed, 1 stalled
    task``: the totals, also of the columns a narrow terminal leaves out."""
    totals = report.totals()
    parts = [f"{totals['runs_in_flight']} run(s) in flight" if totals["runs_in_flight"] else "no run in flight"]
    if totals["failed_runs"]:
        parts[0] += f", {totals['failed_runs']} failed"
    if totals["waiting_manual_tasks"]:
        parts.append(f"{totals['waiting_manual_tasks']} manual task(s) waiting")
    if totals["stalled_tasks"] or totals["permanently_stalled_tasks"]:
        parts.append(f"{totals['stalled_tasks']} stalled task(s), {totals['permanently_stalled_tasks']} given up")
    workers = f"{totals['live_workers']} live worker(s)" + (f", {totals['stale_workers']} stale"
                                                            if totals["stale_workers"] else "")
    parts.append(f"{totals['backlog']} message(s) in the queues, {workers}")
    return f"{totals['flows']} flow(s): " + "; ".join(parts)

"""``pgflow status``: what runs, per flow (read-only; docs/commands/status.md)."""

from __future__ import annotations

import sys
import threading
from typing import Annotated, Optional

import psycopg
import typer

from pgflow_cli import db, render
from pgflow_cli.cli import common
from pgflow_cli.cli.report_formats import (
    ReportFormat,
    ReportFormatOption,
    age,
    chosen,
    database,
    write_document,
    write_lines,
    write_table,
)
from pgflow_cli.errors import ExitCode
from pgflow_cli.operations import status as status_op
from pgflow_cli.operations.coverage import DEFAULT_HEARTBEAT_WINDOW

HELP = """What runs, per flow, in one read-only snapshot: runs by state, tasks by state, the oldest
queued task and how long it has waited, stalled tasks (what the next pgflow.requeue_stalled_tasks()
call would take back, and tasks it gave up on), each queue's backlog from PGMQ's metrics (plain flow
queues and private step queues) and the workers (live, deprecated, stale).

--watch redraws every SECONDS (default 2) until Ctrl-C; with --format json it writes one document per
line. Read-only: SELECT on the pgflow and pgmq tables suffices.

Exit 0: shown. Exit 3: cannot connect or no pgflow schema. Exit 6: a --flow that names no flow.
Exit 130: --watch stopped with Ctrl-C (the normal end of a watch)."""

WATCH_DEFAULT = 2.0


def register(app: typer.Typer) -> None:
    """Attach ``status`` to the root command."""
    app.command("status", help=HELP)(status)


def status(
    flow: Annotated[Optional[str], typer.Option("--flow", metavar="SLUG", show_default=False,
                                                help="Only this flow (exact slug).")] = None,
    watch: Annotated[Optional[float], typer.Option(
        "--watch", metavar="[SECONDS]", is_flag=False, flag_value=WATCH_DEFAULT, min=0.2, show_default=False,
        help=f"Redraw every SECONDS (default {WATCH_DEFAULT:g}) until Ctrl-C.")] = None,
    output_format: ReportFormatOption = None,
    heartbeat_window: Annotated[float, typer.Option(
        "--heartbeat-window", min=0.1, metavar="SECONDS",
        help="A worker is live when its last heartbeat is at most this old (as `pgflow coverage`).")]
    = DEFAULT_HEARTBEAT_WINDOW,
    dsn: common.DsnOption = None,
    sandbox: common.SandboxOption = False,
    connect_timeout: common.ConnectTimeoutOption = 10,
) -> None:
    fmt = chosen(output_format)
    if fmt == ReportFormat.json:
        common.STATE.output_format = common.OutputFormat.json
    conn, target = common.open_connection(dsn, sandbox, connect_timeout)
    stop = threading.Event()
    with common.mapped_errors(target), conn:
        try:
            while True:
                report = status_op.collect(conn, flow, heartbeat_window=heartbeat_window)
                show(report, fmt, conn, target, redraw=watch is not None)
                if watch is None or stop.wait(watch):
                    return
        except KeyboardInterrupt:
            if watch is None:
                raise
            render.stderr_console().print("stopped watching")
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None


def show(report: status_op.StatusReport, fmt: ReportFormat, conn: psycopg.Connection, target: db.Target,
         redraw: bool = False) -> None:
    """Render one snapshot in ``fmt`` (the function that switches to the shared renderer)."""
    if fmt == ReportFormat.json:
        document = report.to_document()
        document["database"] = database(conn, target)
        write_document(document, compact=redraw)
        return
    if redraw and fmt == ReportFormat.table and sys.stdout.isatty():
        render.stdout_console().clear()
    write_table(fmt, "pgflow status" + (f" --flow {report.flow_filter}" if report.flow_filter else ""),
                ["flow", "in flight", "done", "failed", "queued", "running", "stalled", "waited", "backlog", "workers"],
                [_flow_row(f) for f in report.flows], drop_order=("done", "failed", "running", "waited"))
    queues = [q for f in report.flows for q in f.queues] + report.other_queues
    if queues:
        write_table(fmt, "queues (PGMQ metrics)", ["queue", "flow", "kind", "messages", "visible", "oldest"],
                    [[q.queue_name + (f" (also {', '.join(q.aliases)})" if q.aliases else ""),
                      q.flow_slug or "(no flow)", q.origin,
                      "unknown (no table)" if q.messages is None else q.messages,
                      "-" if q.visible is None else q.visible, age(q.oldest_message_age_seconds)]
                     for q in queues], drop_order=("kind", "visible", "oldest"))
    write_lines([summary(report)], "bold green" if not report.runs_in_flight else "bold", fmt)


def _flow_row(flow: status_op.FlowStatus) -> list[object]:
    oldest = flow.oldest_queued
    stalled = ("unknown (not analysed)" if flow.stalled is None else str(flow.stalled)
               + (f" (+{flow.permanently_stalled} given up)" if flow.permanently_stalled else ""))
    workers = ("unknown (not analysed)" if flow.workers is None
               else ", ".join(f"{n} {kind}" for kind, n in flow.workers.items() if n) or "none")
    return [flow.flow_slug, flow.runs_in_flight, flow.runs.get("completed", 0), flow.runs.get("failed", 0),
            flow.tasks.get("queued", 0), flow.tasks.get("started", 0), stalled,
            age(oldest.age_seconds) if oldest else "-", flow.backlog, workers]


def summary(report: status_op.StatusReport) -> str:
    """The closing line, e.g. ``3 flow(s): no run in flight`` or ``... 2 run(s) in flight, 1 stalled task``."""
    totals = report.totals()
    parts = [f"{totals['runs_in_flight']} run(s) in flight" if totals["runs_in_flight"] else "no run in flight"]
    if totals["stalled_tasks"] or totals["permanently_stalled_tasks"]:
        parts.append(f"{totals['stalled_tasks']} stalled task(s), {totals['permanently_stalled_tasks']} given up")
    parts.append(f"{totals['backlog']} message(s) in the queues, {totals['live_workers']} live worker(s)")
    return f"{totals['flows']} flow(s): " + "; ".join(parts)

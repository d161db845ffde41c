"""``pgflow runs list`` / ``pgflow runs show``: runs, steps, tasks, attempts, errors (read-only; docs/commands/runs.md)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Annotated, Any, Optional

import typer

from pgflow_cli.cli import common
from pgflow_cli.cli.report_formats import (
    ReportFormat,
    ReportFormatOption,
    chosen,
    database,
    target_args,
    write_document,
    write_lines,
    write_table,
)
from pgflow_cli.operations import runs as runs_op
from pgflow_cli.operations.status import RUN_STATES

app = typer.Typer(
    help="Runs and what happened in them (read-only). Run inputs and message bodies are never shown; "
    "outputs only with `runs show --show-output`.",
    no_args_is_help=True,
)


def register(root: typer.Typer) -> None:
    """Attach the ``runs`` group to the root command."""
    root.add_typer(app, name="runs")


@app.command("list")
def list_(
    flow: Annotated[Optional[str], typer.Option("--flow", metavar="SLUG", show_default=False,
                                                help="Only runs of this flow (exact slug).")] = None,
    status: Annotated[Optional[str], typer.Option("--status", metavar="STATE", show_default=False,
                                                  help="Only runs in this state: " + ", ".join(RUN_STATES) + ".")]
    = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=runs_op.MAX_LIMIT, metavar="N",
                                       help="Runs per page, newest first.")] = 20,
    before: Annotated[Optional[str], typer.Option("--before", metavar="RUN_ID", show_default=False,
                                                  help="The next page: runs started before this run (the id "
                                                  "the previous page's `next:` line gives).")] = None,
    output_format: ReportFormatOption = None,
    dsn: common.DsnOption = None,
    sandbox: common.SandboxOption = False,
    connect_timeout: common.ConnectTimeoutOption = 10,
) -> None:
    """List runs, newest first.

    Exit 0: listed (also when none matched). Exit 2: a bad --status, --limit or --before. Exit 3: cannot
    connect or no pgflow schema. Exit 6: --flow or --before names nothing.
    """
    fmt = chosen(output_format)
    if fmt == ReportFormat.json:
        common.STATE.output_format = common.OutputFormat.json
    conn, target = common.open_connection(dsn, sandbox, connect_timeout)
    with common.mapped_errors(target), conn:
        page = runs_op.list_runs(conn, flow=flow, status=status, limit=limit, before=before)
        if fmt == ReportFormat.json:
            write_document({**page.to_document(), "database": database(conn, target)})
            return
    show_page(page, fmt, target_args(dsn, sandbox))


def show_page(page: runs_op.RunPage, fmt: ReportFormat, target: str) -> None:
    """Render a page of runs (not json): one of the functions that switch to the shared renderer."""
    write_table(fmt, "runs, newest first", ["run id", "flow", "status", "started (UTC)", "ended (UTC)", "failed steps"],
                [[r.run_id, r.flow_slug, r.status, _when(r.started_at), _when(r.completed_at or r.failed_at),
                  f"{r.failed_steps} of {r.steps}"] for r in page.runs],
                drop_order=("ended (UTC)", "failed steps", "flow"))
    lines = [f"{len(page.runs)} run(s)" + ("" if page.next_before else "; no more")]
    if page.next_before:
        options = "".join(f" --{k} {v}" for k, v in (("flow", page.flow), ("status", page.status)) if v)
        limit = f" --limit {page.limit}" if page.limit != 20 else ""
        lines.append(f"next: pgflow runs list{options}{limit} --before {page.next_before}{target}")
    write_lines(lines, "dim", fmt)


@app.command("show")
def show(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The run's id (a UUID).", show_default=False)],
    show_output: Annotated[bool, typer.Option("--show-output",
                                              help="Also show the outputs of the run, its steps and tasks.")] = False,
    max_tasks: Annotated[int, typer.Option("--max-tasks", min=1, metavar="N",
                                           help="Show at most N tasks (a map step may have thousands).")] = 200,
    output_format: ReportFormatOption = None,
    dsn: common.DsnOption = None,
    sandbox: common.SandboxOption = False,
    connect_timeout: common.ConnectTimeoutOption = 10,
) -> None:
    """Show one run: its steps, tasks, attempts and errors (outputs only with --show-output).

    Exit 0: shown. Exit 2: RUN_ID is not a UUID. Exit 3: cannot connect or no pgflow schema. Exit 6: no such run.
    """
    fmt = chosen(output_format)
    if fmt == ReportFormat.json:
        common.STATE.output_format = common.OutputFormat.json
    runs_op.parse_run_id(run_id)  # a bad id is a usage error before any connection
    conn, target = common.open_connection(dsn, sandbox, connect_timeout)
    with common.mapped_errors(target), conn:
        detail = runs_op.show_run(conn, run_id, show_output=show_output, max_tasks=max_tasks)
        if fmt == ReportFormat.json:
            write_document({**detail.to_document(), "database": database(conn, target)})
            return
    show_detail(detail, fmt)


def show_detail(detail: runs_op.RunDetail, fmt: ReportFormat) -> None:
    """Render one run (not json): one of the functions that switch to the shared renderer."""
    run = detail.run
    ended = run["completed_at"] or run["failed_at"]
    lines = [f"run {run['run_id']} of flow {run['flow_slug']}: {run['status']}",
             f"started {_when(run['started_at'])} UTC" + (f", ended {_when(ended)} UTC" if ended else "")
             + f"; {run['remaining_steps']} step(s) remaining"]
    if detail.show_output:
        lines.append(f"output: {_json_text(run.get('output'))}")
    write_lines(lines, "bold", fmt)
    step_headers = ["step", "type", "status", "tasks", "max attempts", "error"] + (["output"] if detail.show_output else [])
    write_table(fmt, "steps", step_headers, [
        [s["step_slug"], s["step_type"], s["status"] + (f" ({s['skip_reason']})" if s["skip_reason"] else ""),
         "-" if s["remaining_tasks"] is None else f"{s['initial_tasks'] - s['remaining_tasks']}/{s['initial_tasks']} done",
         s["max_attempts"], s["error_message"] or "-"] + ([_json_text(s.get("output"))] if detail.show_output else [])
        for s in detail.steps], drop_order=("max attempts", "type"))
    task_headers = ["step", "task", "status", "attempts", "requeued", "message", "error"] + (
        ["output"] if detail.show_output else [])
    write_table(fmt, "tasks", task_headers, [
        [t["step_slug"], t["task_index"], _task_state(t), t["attempts_count"], t["requeued_count"],
         t["message_id"] if t["message_id"] is not None else "-", t["error_message"] or "-"]
        + ([_json_text(t.get("output"))] if detail.show_output else [])
        for t in detail.tasks], drop_order=("message", "requeued"))
    if detail.tasks_total > len(detail.tasks):
        write_lines([f"{detail.tasks_total - len(detail.tasks)} more task(s) not shown (--max-tasks)"], "dim", fmt)


def _task_state(task: dict[str, Any]) -> str:
    state = str(task["status"])
    if task["permanently_stalled_at"] is not None:
        state += " (stalled, given up)"
    if task["execution_mode"] == "manual":
        state += " (manual)"
    return state


def _when(value: Any) -> str:
    return "-" if value is None else value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _json_text(value: Any) -> str:
    return "-" if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"))

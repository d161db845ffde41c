"""``pgflow workers list`` / ``pgflow workers forget``: worker rows, and deleting those long dead
(docs/commands/workers.md)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from pgflow_cli import render
from pgflow_cli.cli import common
from pgflow_cli.cli.common import ANY_TARGET, OutputFormat, TargetOptions
from pgflow_cli.errors import ExitCode, UsageError
from pgflow_cli.operations import workers as op
from pgflow_cli.operations.coverage import DEFAULT_HEARTBEAT_WINDOW

app = typer.Typer(
    help="Worker rows (pgflow.workers): which worker serves which route, its heartbeat and its tasks in "
    "flight; and deleting the rows of workers that died without saying so.\n\n"
    "A worker killed with SIGKILL, or on a host that went away, never marks its row stopped: `pgflow status` and "
    "`pgflow coverage` show it as stale until `pgflow workers forget --stale-for DURATION` deletes it "
    "(only rows without a heartbeat for that long and without a task in flight, in one transaction).\n\n"
    "Exit 0: listed, or forgotten. Exit 2: bad options, or forget without --yes off a terminal. Exit 3: "
    "cannot connect or no pgflow schema. Exit 4: a row stayed locked. Exit 130: confirmation declined.\n\n"
    "\b\nExamples:\n  pgflow workers list\n  pgflow workers list --flow orders --format json\n"
    "  pgflow workers forget --stale-for 1d --dry-run\n  pgflow workers forget --stale-for 1d --yes",
    no_args_is_help=True,
    rich_markup_mode=None,
)

FlowOption = Annotated[str | None, typer.Option(
    "--flow", metavar="SLUG", show_default=False,
    help="Only workers of this flow (exact slug): those that registered it or serve one of its routes.")]
WindowOption = Annotated[float, typer.Option(
    "--heartbeat-window", min=0.1, metavar="SECONDS",
    help="A worker is live when its last heartbeat is at most this old (as `pgflow status`).")]

CSV_COLUMNS = ["worker_id", "function_name", "flow_slug", "step_slug", "queue_name", "worker_version", "state",
               "started_at", "last_heartbeat_at", "stopped_at", "heartbeat_age_seconds", "tasks_in_flight", "serves"]
"""One CSV row per worker row, in this column order."""

COLUMNS = (
    render.Column("state", "state"),
    render.Column("function", "function", wrap=True),
    render.Column("serves", "serves", wrap=True),
    render.Column("heartbeat", "last heartbeat", justify="right"),
    render.Column("in_flight", "tasks", justify="right"),
    render.Column("version", "version", drop=2, wrap=True),
    render.Column("worker", "worker id", drop=3),
    render.Column("queue", "queue", drop=4, wrap=True),
)
"""One row per worker row; too narrow a terminal leaves out queue, worker id and version first."""

STATE_STYLE = {"stale": "bold red", "draining": "yellow", "live": "green", "stopped": "dim"}


def register(root: typer.Typer) -> None:
    """Attach the ``workers`` group to the root command."""
    root.add_typer(app, name="workers")


def _table(rows: list[op.WorkerRow], page: render.Page, title: str) -> None:
    page.table(COLUMNS, [{
        "state": r.state, "function": r.function_name, "serves": ", ".join(r.serves) or "(no route)",
        "heartbeat": render.age(r.heartbeat_age_seconds) + " ago", "in_flight": r.tasks_in_flight,
        "version": r.worker_version or "-", "worker": r.worker_id, "queue": r.queue_name,
    } for r in rows], title=title, style=lambda key, row: STATE_STYLE.get(str(row["state"])) if key == "state" else None)


@app.command("list")
@common.option_groups
def list_(
    flow: FlowOption = None,
    stale_for: Annotated[str | None, typer.Option(
        "--stale-for", metavar="DURATION", show_default=False,
        help="Only rows without a heartbeat for at least this long (90, 15m, 2h, 1d): what `forget` would "
        "consider.")] = None,
    heartbeat_window: WindowOption = DEFAULT_HEARTBEAT_WINDOW,
    output_format: common.FormatOption = OutputFormat.table,
    where: TargetOptions = ANY_TARGET,
) -> None:
    """Every worker row: state (stale, draining, live, stopped), function, the routes it serves, its last
    heartbeat and its tasks in flight; stale rows first. Read-only.

    \b
    Examples:
      pgflow workers list
      pgflow workers list --stale-for 1h --format plain
    """
    seconds = common.parse_duration(stale_for, "--stale-for") if stale_for is not None else None
    with where.connected() as (conn, target):
        rows = op.list_workers(conn, flow=flow, stale_for=seconds, heartbeat_window=heartbeat_window)
    if output_format == OutputFormat.json:
        render.write_json(common.versioned(op.list_document(rows, heartbeat_window), target))
        return
    if output_format == OutputFormat.csv:
        render.write_csv(CSV_COLUMNS, [r.to_dict() for r in rows])
        return
    page = render.Page(output_format.value)
    _table(rows, page, "worker rows, stale first")
    counts = {state: sum(1 for r in rows if r.state == state) for state in op.STATES}
    page.line(f"{len(rows)} worker row(s): " + ", ".join(f"{n} {state}" for state, n in counts.items() if n)
              if rows else "no worker rows", "bold")
    if counts["stale"]:
        page.line(common.with_target("stale rows are workers that died without stopping; once they are long gone: "
                                     "pgflow workers forget --stale-for 1d --dry-run"), "dim")


@app.command("forget")
@common.option_groups
def forget(
    stale_for: Annotated[str, typer.Option(
        "--stale-for", metavar="DURATION", show_default=False,
        help=f"Delete rows without a heartbeat for at least this long (90, 15m, 2h, 1d; at least "
        f"{op.MIN_STALE_FOR:g} s), stopped or not, unless a task they claimed is still in flight.")],
    flow: FlowOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would be deleted; delete nothing.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask (required when not on a terminal).")] = False,
    output_format: common.ReportFormatOption = OutputFormat.table,
    where: TargetOptions = ANY_TARGET,
) -> None:
    """Delete the rows of workers that died long ago: no heartbeat for --stale-for and no task in flight,
    in one transaction. Finished tasks keep their rows (their last worker becomes unknown). A function whose
    every row is forgotten is no longer found by `pgflow fence --flow` (name it with --function).

    \b
    Examples:
      pgflow workers forget --stale-for 1d --dry-run
      pgflow workers forget --stale-for 12h --flow orders --yes
    """
    seconds = common.parse_duration(stale_for, "--stale-for")
    interactive = not (yes or dry_run)
    if interactive and not sys.stdin.isatty():
        raise UsageError("workers forget deletes rows: off a terminal, confirm with --yes (or look first with --dry-run)")
    with where.connected() as (conn, target):
        if interactive:
            preview = op.forget(conn, stale_for=seconds, flow=flow, dry_run=True)
            err = render.stderr_console()
            for w in preview.candidates:
                if w.worker_id in preview.forgotten:
                    err.print(render.text(f"  {w.state} worker {w.worker_id} ({w.function_name}, serves "
                                          f"{', '.join(w.serves) or 'no route'}): last heartbeat "
                                          f"{render.span(w.heartbeat_age_seconds)} ago"))
            if preview.forgotten and not typer.confirm(f"Delete these {len(preview.forgotten)} worker row(s)?",
                                                       err=True):
                err.print("cancelled; nothing changed")
                raise typer.Exit(int(ExitCode.INTERRUPTED))
            confirmed: list[str] | None = preview.forgotten
        else:
            confirmed = None
        report = op.forget(conn, stale_for=seconds, flow=flow, dry_run=dry_run, only=confirmed)
    if output_format == OutputFormat.json:
        render.write_json(common.versioned(report.to_document(), target))
        return
    page = render.Page(output_format.value)
    verb = "would delete" if dry_run else "deleted"
    if report.forgotten:
        _table([w for w in report.candidates if w.worker_id in report.forgotten], page, f"{verb}: worker rows")
    for kept in report.kept:
        page.line(f"kept worker {kept.worker_id} ({kept.function_name}): "
                  + (f"{kept.tasks_in_flight} task(s) in flight" if kept.tasks_in_flight else "it heartbeat meanwhile"),
                  "yellow")
    page.line(f"{verb} {len(report.forgotten)} worker row(s) without a heartbeat for {stale_for}"
              + (" (dry run: nothing changed)" if dry_run else ""), "bold")

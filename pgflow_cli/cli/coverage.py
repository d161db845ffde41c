"""``pgflow coverage``: which routes have live workers, and which have work waiting (docs/coverage.md)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from pgflow_cli import render
from pgflow_cli.cli import common
from pgflow_cli.cli.common import OutputFormat
from pgflow_cli.operations import coverage as coverage_op

CSV_COLUMNS = [
    "flow_slug", "step_slug", "step_index", "queue_mode", "queue_name", "state", "work_waiting", "live_workers",
    "live_versions", "draining_workers", "draining_versions", "stale_workers", "last_heartbeat_at", "functions",
    "fenced_functions", "queue_exists", "queue_readable", "backlog", "visible_messages", "oldest_message_age_seconds",
]
"""One CSV row per route, in this column order (docs/coverage.md)."""

STATE_STYLE = {
    "covered": "green", "draining": "yellow", "fenced": "yellow", "stale": "red", "uncovered": "bold red",
    "queue_missing": "bold red",
}

HELP = """Persisted routes versus live workers: for every route (a plain flow's queue, or each step's
private queue) the live workers and the versions they reported, deprecated workers still draining,
killed workers (stale), fenced functions, and the queue's backlog and oldest message. Routes without
a live worker and with messages waiting are flagged "work waiting"; workers polling queues no route
owns are listed.

States: covered, draining, fenced, stale, uncovered, queue_missing. Read-only; SELECT on the pgflow
and pgmq tables suffices. `--sql` prints the same query for psql.

Gate a deployment on it: start the new version's workers, then `pgflow coverage --flow NEW --wait
--timeout 120` before switching callers (docs/step-queues.md).

Exit 0: every route covered. Exit 1: a route is not covered. Exit 3: cannot connect or no pgflow
schema. Exit 5: --wait reached --timeout (the routes still missing are named). Exit 6: a --flow that
names no flow (without --wait).

\b
Examples:
  pgflow coverage
  pgflow coverage --flow orders_v2 --wait --timeout 120
  pgflow coverage --format csv > routes.csv
  pgflow coverage --sql > coverage.sql"""


def register(app: typer.Typer) -> None:
    """Attach ``coverage`` to the root command."""
    app.command("coverage", help=HELP)(common.option_groups(coverage))


def coverage(
    flow: Annotated[list[str] | None, typer.Option(
        "--flow", metavar="SLUG", show_default=False,
        help="Check only this flow (exact slug; repeat for several).")] = None,
    output_format: common.FormatOption = OutputFormat.table,
    heartbeat_window: Annotated[float, typer.Option(
        "--heartbeat-window", min=0.1, metavar="SECONDS",
        help="A worker is live when its last heartbeat is at most this old (default: three 5 s heartbeat "
        "intervals, so one late beat does not flap a route).")] = coverage_op.DEFAULT_HEARTBEAT_WINDOW,
    wait: Annotated[bool, typer.Option(
        "--wait", help="Check repeatedly until every route is covered (progress on stderr); exit 5 at --timeout.")]
    = False,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, metavar="SECONDS", help="Deadline of --wait.")]
    = 300.0,
    interval: Annotated[float, typer.Option("--interval", min=0.1, metavar="SECONDS",
                                            help="Seconds between checks with --wait.")] = 2.0,
    print_sql: Annotated[bool, typer.Option(
        "--sql", help="Print the coverage query as a read-only psql script and exit; no database is contacted.")]
    = False,
    where: common.TargetOptions = common.ANY_TARGET,
) -> None:
    common.STATE.output_format = output_format
    if print_sql:
        sys.stdout.write(coverage_op.psql_script(flow, heartbeat_window))
        sys.stdout.flush()
        return
    err = render.stderr_console()
    conn, target = where.open()

    def progress(report: coverage_op.CoverageReport, left: float) -> None:
        missing = report.describe_missing()
        err.print(render.text(f"waiting ({left:.0f} s left): {len(missing)} not covered: " + "; ".join(missing), "dim"))

    with conn, common.mapped_errors(target, conn):
        if wait:
            report = coverage_op.wait_for_coverage(conn, flow, heartbeat_window=heartbeat_window, timeout=timeout,
                                                   interval=interval, progress=progress)
        else:
            report = coverage_op.check_coverage(conn, flow, heartbeat_window=heartbeat_window)

    if output_format == OutputFormat.json:
        render.write_json(common.versioned(report.to_document(), target))
    elif output_format == OutputFormat.csv:
        render.write_csv(CSV_COLUMNS, [r.to_dict() for r in report.routes])
    else:
        _render_table(report, render.Page(output_format.value))
    code = report.exit_code()
    if code:
        raise typer.Exit(code)


COLUMNS = (
    render.Column("flow", "flow", wrap=True),
    render.Column("step", "step", wrap=True),
    render.Column("queue", "queue", drop=6, wrap=True),
    render.Column("state", "state"),
    render.Column("live", "live workers (versions)", wrap=True),
    render.Column("draining", "draining", drop=2, wrap=True),
    render.Column("stale", "stale", drop=4, justify="right"),
    render.Column("fenced", "fenced functions", drop=3, wrap=True),
    render.Column("backlog", "backlog", justify="right"),
    render.Column("oldest", "oldest", drop=5, justify="right"),
)
"""One row per route; too narrow a terminal leaves out queue, oldest, stale, fenced, draining (in that
order; the flow and step name the route, the state says fenced or draining)."""


def _versions(count: int, versions: list[str]) -> str:
    return f"{count} ({', '.join(versions)})" if count else "0"


def _backlog(route: coverage_op.Route) -> str:
    if not route.queue_exists:
        return "no queue"
    if route.backlog is None:
        return "unreadable"
    text = f"{route.backlog}"
    if route.backlog and route.visible_messages is not None and route.visible_messages != route.backlog:
        text += f" ({route.visible_messages} visible)"
    return text




def _style(key: str, row: Mapping[str, Any]) -> str | None:
    route: coverage_op.Route = row["route"]
    if key == "state":
        return "bold red" if route.work_waiting else STATE_STYLE.get(route.state)
    if key == "backlog":
        return "bold red" if not route.queue_exists or route.work_waiting else "dim" if route.backlog is None else None
    if key in ("step", "oldest"):
        return "dim" if row[key] in ("(all steps)", "-") else None
    return None


def _render_table(report: coverage_op.CoverageReport, page: render.Page) -> None:
    rows = [{
        "route": route, "flow": route.flow_slug, "step": route.step_slug or "(all steps)", "queue": route.queue_name,
        "state": route.state.replace("_", " ") + (" (work waiting)" if route.work_waiting else ""),
        "live": _versions(route.live_workers, route.live_versions),
        "draining": _versions(route.draining_workers, route.draining_versions), "stale": route.stale_workers,
        "fenced": ", ".join(route.fenced_functions) or "-", "backlog": _backlog(route),
        "oldest": render.age(route.oldest_message_age_seconds),
    } for route in report.routes]
    page.table(COLUMNS, rows, title=f"pgflow coverage (heartbeat window {report.heartbeat_window:g} s)", style=_style)
    if report.unowned_workers:
        page.line("workers polling queues no route owns:", "bold yellow")
        for w in report.unowned_workers:
            owner = f"flow {w.flow_slug}" + (f" step {w.step_slug}" if w.step_slug else "") if w.flow_slug else "no flow"
            page.line(f"  worker {w.worker_id} (function {w.function_name}, {owner}) polls queue {w.queue_name}"
                      + (" [deprecated]" if w.deprecated else ""))
    counts = report.counts()
    summary = ", ".join(f"{n} {state.replace('_', ' ')}" for state, n in counts.items() if n)
    waiting = sum(1 for r in report.routes if r.work_waiting)
    line = f"{len(report.routes)} route(s): {summary or 'none'}"
    if waiting:
        line += f"; work waiting on {waiting} route(s)"
    page.line(line, "bold green" if report.covered else "bold red")

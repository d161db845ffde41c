"""``pgflow fence disable | restore | status``: the worker-function enable fence (docs/rollout.md).

Data (what changed, the final drain state) goes to stdout; the live drain view goes to stderr.
Exit codes (docs/exit-codes.md): 5 the drain or the heartbeat wait reached --timeout with work
still in flight (named on stderr); 6 a state conflict (unknown function or flow, nothing to
restore, a row changed since the fence); 130 Ctrl-C: you stopped watching, the fence stays.
"""

from __future__ import annotations

import getpass
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import psycopg
import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table

from pgflow_cli import db, render
from pgflow_cli.cli import common
from pgflow_cli.cli.common import ANY_TARGET, OutputFormat, TargetOptions
from pgflow_cli.errors import DeadlineReached, ExitCode, PgflowError
from pgflow_cli.operations import fence as fence_op
from pgflow_cli.operations.waiting import Pacer

app = typer.Typer(
    help="The rollout fence on worker functions: disable them (their workers refuse to register, the HTTP "
    "starter skips them), drain what their workers still run, and later restore exactly the recorded "
    "values.\n\n"
    "Typical in-place rollout: `fence disable --flow F -m WHY` (waits for the drain) -> deploy the new "
    "code -> `fence restore --flow F --wait-heartbeat`. Runbook: docs/rollout.md.",
    no_args_is_help=True,
)


FunctionOption = Annotated[
    list[str] | None,
    typer.Option("--function", help="A worker function (pgflow.worker_functions.function_name); repeat for several.",
                 metavar="NAME", show_default=False),
]
FlowOption = Annotated[
    list[str] | None,
    typer.Option("--flow", help="Every worker function whose workers serve this flow's routes (its steps' queues); "
                 "repeatable.", metavar="SLUG", show_default=False),
]
WindowOption = Annotated[
    float,
    typer.Option("--heartbeat-window", min=0.1, max=86400, metavar="SECONDS",
                 help="A worker without a heartbeat for this long counts as gone (its started tasks as stranded)."),
]
IntervalOption = Annotated[
    float,
    typer.Option("--interval", min=0.1, max=60, metavar="SECONDS", help="Seconds between looks while waiting."),
]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Show the rows it would change, then roll back; changes nothing.")
]
LockTimeoutOption = Annotated[
    float, typer.Option("--lock-timeout", min=0.1, max=600, metavar="SECONDS",
                        help="Seconds to wait for a function row's lock (a registering worker holds it briefly).")
]
RetriesOption = Annotated[
    int, typer.Option("--retries", min=1, max=50, metavar="N", help="Attempts on lock timeouts and deadlocks (exit 4 after).")
]


@dataclass(frozen=True)
class ChangeOptions:
    """The options ``fence disable`` and ``fence restore`` share: a dry run, the row lock's timeout and
    retries, and how they then wait (a worker's heartbeat window, seconds between looks)."""

    dry_run: DryRunOption = False
    heartbeat_window: WindowOption = fence_op.DEFAULT_WINDOW
    interval: IntervalOption = 1.0
    lock_timeout: LockTimeoutOption = 5.0
    retries: RetriesOption = 5


ANY_CHANGE = ChangeOptions()
"""The default of the commands' :class:`ChangeOptions` parameter (typer fills in the options given)."""


def register(root: typer.Typer) -> None:
    """Attach ``fence`` to the root command."""
    root.add_typer(app, name="fence")


def application_name() -> str:
    """``pgflow fence (user@host)``, at most 63 bytes: recorded with the fence as who changed it."""
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (containers)
        user = "unknown"
    name = f"pgflow fence ({user}@{socket.gethostname()})"
    return name.encode("utf-8")[:63].decode("utf-8", "ignore")


@contextmanager
def _connection(where: TargetOptions) -> Iterator[psycopg.Connection]:
    """Connect as ``pgflow fence (user@host)``, check the fence record exists, map database errors."""
    target = where.resolve()
    common.STATE.target = target
    conn = db.connect(target, application_name=application_name(), connect_timeout=where.connect_timeout)
    common.STATE.target = target = target.connected(conn)
    try:
        with common.mapped_errors(target, conn):
            fence_op.require_installed(conn)
            yield conn
    finally:
        conn.close()


def _interrupted(message: str, hint: str) -> PgflowError:
    return PgflowError(message, hint=hint, exit_code=ExitCode.INTERRUPTED)


def _restore_command(functions: list[str]) -> str:
    return "pgflow fence restore " + " ".join(f"--function {f}" for f in functions)


# ----------------------------------------------------------------------------------------------
# disable
# ----------------------------------------------------------------------------------------------
@app.command()
@common.option_groups
def disable(
    function: FunctionOption = None,
    flow: FlowOption = None,
    every: Annotated[bool, typer.Option("--all", help="Every worker function (an upgrade that changes the worker "
                                        "protocol stops them all).")] = False,
    reason: Annotated[
        str, typer.Option("-m", "--reason", help="Why (kept with the fence and shown by `fence status`).",
                          metavar="REASON", show_default=False)
    ] = "",
    timeout: Annotated[
        float, typer.Option("--timeout", min=0, max=86400, metavar="SECONDS",
                            help="Give up waiting for the drain after this long (exit 5; the fence stays).")
    ] = fence_op.DEFAULT_DRAIN_TIMEOUT,
    detach: Annotated[bool, typer.Option("--detach", help="Return once disabled and deprecated; do not wait.")] = False,
    options: ChangeOptions = ANY_CHANGE,
    where: TargetOptions = ANY_TARGET,
    output_format: common.ReportFormatOption = OutputFormat.table,
) -> None:
    """Fence worker functions: record their `enabled`, disable them, deprecate their workers, wait for the drain.

    The record (pgflow.fences) holds the value found, the value written, the reason, who and when.
    Disabled functions' workers refuse to register (a supervisor restart is refused) and the HTTP
    starter never pings them. Deprecated workers stop polling and finish what they hold; the command
    then waits until none of them heartbeats within --heartbeat-window and no task they started is
    in flight (a dead worker's started tasks are reported as stranded: stalled recovery requeues
    them). Running it again on the same functions changes nothing and waits again.

    Exit 0 drained (or --detach, --dry-run); 4 a function row stayed locked (nothing changed); 5
    --timeout reached with work in flight (named); 6 an unknown function or flow, or a fence that no
    longer matches its row; 130 Ctrl-C (the fence stays).

    \b
    Examples:
      pgflow fence disable --flow orders -m 'deploy 2.4'
      pgflow fence disable --function orders-worker -m 'hotfix' --detach
      pgflow fence disable --all -m 'protocol upgrade' --dry-run
    """
    common.STATE.output_format = OutputFormat(output_format.value)
    as_json = output_format == OutputFormat.json
    with _connection(where) as conn:
        selection = fence_op.select(conn, function or [], flow or [], every=every)
        result = fence_op.disable(conn, selection, reason, dry_run=options.dry_run, lock_timeout=options.lock_timeout,
                                  attempts=options.retries)
        page = render.Page(output_format.value)
        if not as_json:
            _print_disable(result, page)
        if options.dry_run or detach:
            result.outcome = "dry_run" if options.dry_run else "detached"
            if as_json:
                render.write_json(common.versioned(result.to_document(), common.STATE.target))
            elif detach:
                page.line(common.with_target("detached: watch the drain with `pgflow fence status --watch`"), "dim")
            return
        last: list[fence_op.DrainProgress] = []
        try:
            with _live_view(not as_json) as show:
                def on_progress(progress: fence_op.DrainProgress) -> None:
                    last[:] = [progress]
                    show(progress)

                result.drain = fence_op.wait_for_drain(conn, selection.functions, window=options.heartbeat_window,
                                                       timeout=timeout, interval=options.interval, on_progress=on_progress)
            result.outcome = "drained"
        except DeadlineReached:
            result.outcome, result.drain = "timeout", (last[0] if last else None)
            _finish_disable(result, page, as_json)
            raise
        except KeyboardInterrupt:
            result.outcome, result.drain = "interrupted", (last[0] if last else None)
            _finish_disable(result, page, as_json)
            raise _interrupted(
                f"stopped watching: the fence stays in place ({len(selection.functions)} function(s) disabled, their "
                "workers deprecated); nothing was undone",
                hint=f"watch again: `pgflow fence status --watch`; undo: `{_restore_command(selection.functions)}`",
            ) from None
        _finish_disable(result, page, as_json)


def _finish_disable(result: fence_op.DisableResult, page: render.Page, as_json: bool) -> None:
    if as_json:
        render.write_json(common.versioned(result.to_document(), common.STATE.target))
        return
    drain = result.drain
    if drain is not None and result.outcome == "drained":
        page.line(f"drained after {drain.elapsed:.1f} s: no worker of {', '.join(drain.functions)} heartbeats within "
                  f"{drain.window:g} s and none of their tasks is in flight", "bold green")
        if drain.queued:
            page.line(f"{drain.queued} queued task(s) wait for the new workers (kept durably)")
    if drain is not None and drain.stranded:
        _print_stranded(drain, page)
    if result.outcome == "drained":
        page.line(common.with_target("next: deploy the new code, then `" + _restore_command(result.selection.functions)
                              + " --wait-heartbeat`"), "bold")


def _print_stranded(drain: fence_op.DrainProgress, page: render.Page) -> None:
    page.line(f"{drain.stranded} started task(s) are stranded (their worker stopped heartbeating); stalled recovery "
              "requeues each at its recovery time, and the new workers run it:", "yellow")
    for task in drain.tasks:
        if not task.in_flight:
            page.line(f"  {task.label()}", "yellow")
    listed = sum(1 for t in drain.tasks if not t.in_flight)
    if drain.stranded > listed:
        page.line(f"  ... and {drain.stranded - listed} more", "yellow")


def _yes_no(value: bool | None) -> str:
    return "" if value is None else ("enabled" if value else "disabled")


DISABLE_COLUMNS = (
    render.Column("function", "function", wrap=True),
    render.Column("action", "action"),
    render.Column("before", "before", drop=2),
    render.Column("now", "now"),
    render.Column("fence", "fence", drop=3),
    render.Column("deprecated", "workers deprecated", drop=1, justify="right"),
    render.Column("flows", "flows served", drop=4, wrap=True),
)
"""What a disable did; too narrow a terminal leaves out flows served, fence, before, workers deprecated."""


def _print_disable(result: fence_op.DisableResult, page: render.Page) -> None:
    title = "dry run: would fence" if result.dry_run else "fenced"
    page.table(DISABLE_COLUMNS, [
        {"function": change.function_name,
         "action": change.action if not result.dry_run else ("would fence" if change.action == "fenced" else change.action),
         "before": _yes_no(change.previous_enabled), "now": "disabled" if result.dry_run else _yes_no(change.enabled),
         "fence": "" if result.dry_run or change.fence_id is None else f"#{change.fence_id}",
         "deprecated": change.workers_deprecated, "flows": ", ".join(result.selection.flows_of(change.function_name))}
        for change in result.changes], title=f"{title} {len(result.changes)} worker function(s)", style=_bold_function)
    reasons = {c.fence_reason for c in result.changes if c.fence_reason}
    if reasons and not result.dry_run:
        page.line("reason: " + " | ".join(sorted(reasons)))
    if result.deprecated:
        verb = "would deprecate" if result.dry_run else "deprecated"
        page.line(f"{verb} {len(result.deprecated)} worker(s):")
        for worker in result.deprecated:
            page.line(f"  {worker.label()}")
    for change in result.changes:
        if change.paused_reason:
            page.line(f"note: {change.function_name} is paused by a fatal claim: {change.paused_reason} "
                      "(a restore keeps it disabled)", "yellow")
        if change.action == "already_fenced":
            page.line(f"note: {change.function_name} was already fenced (fence #{change.fence_id}); "
                      "its record is unchanged", "dim")
    shared = [(c.function_name, result.selection.flows_of(c.function_name)) for c in result.changes]
    for name, flows in shared:
        extra = sorted(set(flows) - set(result.selection.requested_flows)) if result.selection.requested_flows else []
        if extra:
            page.line(f"note: {name} also serves {', '.join(extra)}; those flows pause too", "yellow")


def _bold_function(key: str, row: Mapping[str, Any]) -> str | None:
    return "bold" if key == "function" else None


# ----------------------------------------------------------------------------------------------
# the live view (stderr)
# ----------------------------------------------------------------------------------------------
@contextmanager
def _live_view(enabled: bool) -> Iterator[Callable[[fence_op.DrainProgress], None]]:
    """A callback that shows each look: a live rich view on a terminal; elsewhere a line per change,
    and at least every 5 s while nothing changes (a silent wait looks hung)."""
    if not enabled:
        yield lambda progress: None
        return
    err = render.stderr_console()
    if not err.is_terminal:
        pacer = Pacer()

        def line(progress: fence_op.DrainProgress) -> None:
            if pacer.due((len(progress.workers), progress.in_flight, progress.stranded, progress.queued)):
                err.print(render.text(_summary(progress)))

        yield line
        return
    with Live(console=err, refresh_per_second=4, transient=True) as live:
        yield lambda progress: live.update(_drain_view(progress))


def _summary(progress: fence_op.DrainProgress) -> str:
    return (f"{progress.state()} after {progress.elapsed:.0f} s: {len(progress.workers)} worker(s) live, "
            f"{progress.in_flight} task(s) in flight, {progress.stranded} stranded, {progress.queued} queued")


WORKER_COLUMNS = (
    render.Column("worker", "worker"), render.Column("function", "function", wrap=True),
    render.Column("flow", "flow", drop=2, wrap=True), render.Column("step", "step", drop=1, wrap=True),
    render.Column("heartbeat", "heartbeat age", justify="right"), render.Column("deprecated", "deprecated", drop=3),
)
STEP_COLUMNS = (
    render.Column("function", "function", wrap=True), render.Column("flow", "flow", wrap=True),
    render.Column("step", "step", wrap=True), render.Column("in_flight", "in flight", justify="right"),
    render.Column("stranded", "stranded", justify="right"), render.Column("oldest", "oldest", drop=1, justify="right"),
)
BACKLOG_COLUMNS = (
    render.Column("flow", "flow", wrap=True), render.Column("step", "step", wrap=True),
    render.Column("queue", "queue", drop=1, wrap=True), render.Column("queued", "queued", justify="right"),
    render.Column("oldest", "oldest", drop=2, justify="right"),
)


def _drain_tables(progress: fence_op.DrainProgress) -> list[tuple[str, Sequence[render.Column], list[dict[str, Any]]]]:
    """The drain's tables (title, columns, rows), those with rows only: workers left, started tasks
    per step, queued backlog."""
    tables: list[tuple[str, Sequence[render.Column], list[dict[str, Any]]]] = [
        ("workers left", WORKER_COLUMNS, [
            {"worker": w.worker_id, "function": w.function_name, "flow": w.flow_slug, "step": w.step_slug or "-",
             "heartbeat": f"{w.heartbeat_age:.1f} s", "deprecated": "yes" if w.deprecated else "no"}
            for w in progress.workers]),
        ("started tasks per step", STEP_COLUMNS, [
            {"function": st.function_name, "flow": st.flow_slug, "step": st.step_slug, "in_flight": st.in_flight,
             "stranded": st.stranded, "oldest": f"{st.oldest_seconds:.0f} s"} for st in progress.steps]),
        ("queued backlog", BACKLOG_COLUMNS, [
            {"flow": b.flow_slug, "step": b.step_slug, "queue": b.queue_name, "queued": b.queued,
             "oldest": f"{b.oldest_seconds:.0f} s"} for b in progress.backlog]),
    ]
    return [table for table in tables if table[2]]


def _drain_view(progress: fence_op.DrainProgress) -> Group:
    """The live drain view on a terminal's stderr (the same tables as :func:`_print_drain`)."""
    parts: list[Any] = [render.text(_summary(progress), "bold")]
    for title, columns, rows in _drain_tables(progress):
        table = Table(title=render.text(title), title_justify="left")
        for column in columns:
            table.add_column(column.header, justify=column.justify)  # type: ignore[arg-type]
        for row in rows:
            table.add_row(*(render.text(row[c.key]) for c in columns))
        parts.append(table)
    return Group(*parts)


def _print_drain(progress: fence_op.DrainProgress, page: render.Page) -> None:
    page.line(_summary(progress), "bold")
    for title, columns, rows in _drain_tables(progress):
        page.table(columns, rows, title=title)


# ----------------------------------------------------------------------------------------------
# restore
# ----------------------------------------------------------------------------------------------
@app.command()
@common.option_groups
def restore(
    function: FunctionOption = None,
    flow: FlowOption = None,
    every: Annotated[bool, typer.Option("--all", help="Restore every active fence.")] = False,
    wait_heartbeat: Annotated[
        bool, typer.Option("--wait-heartbeat", help="Then wait until a new worker heartbeats for each function "
                           "enabled again (exit 5 at --timeout).")
    ] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0, max=86400, metavar="SECONDS",
                            help="With --wait-heartbeat: give up after this long (exit 5; the restore is kept).")
    ] = fence_op.DEFAULT_HEARTBEAT_TIMEOUT,
    options: ChangeOptions = ANY_CHANGE,
    where: TargetOptions = ANY_TARGET,
    output_format: common.ReportFormatOption = OutputFormat.table,
) -> None:
    """Lift fences: write back exactly the recorded `enabled` values where nobody changed the row since.

    A function that was disabled before the fence stays disabled. A row changed since the fence
    (enabled by hand, even if disabled again; deleted; recreated), or paused by a fatal claim during
    the fence, is left exactly as it is and reported as a conflict (exit 6); the other functions are
    restored. Every fence processed is closed and kept in pgflow.fences.

    Exit 0 restored (and, with --wait-heartbeat, each enabled function has a new worker); 5 no new
    heartbeat by --timeout; 6 a conflict, or no recorded fence for what you named; 130 Ctrl-C.

    \b
    Examples:
      pgflow fence restore --flow orders --wait-heartbeat
      pgflow fence restore --function orders-worker --dry-run
    """
    common.STATE.output_format = OutputFormat(output_format.value)
    as_json = output_format == OutputFormat.json
    with _connection(where) as conn:
        selection = fence_op.restore_selection(conn, function or [], flow or [], every)
        result = fence_op.restore(conn, selection, dry_run=options.dry_run, lock_timeout=options.lock_timeout,
                                  attempts=options.retries)
        page = render.Page(output_format.value)
        if not as_json:
            _print_restore(result, page)
        conflict = result.conflict_error()
        waiting = result.enabled_again
        if not wait_heartbeat or options.dry_run or not waiting:
            if as_json:
                render.write_json(common.versioned(result.to_document(), common.STATE.target))
            if conflict:
                raise conflict
            return
        since = max(c.closed_at for c in result.changes if c.action == "restored" and c.closed_at is not None)
        result.waiting_for = list(waiting)
        err = render.stderr_console()
        pacer, started = Pacer(), time.monotonic()

        def on_progress(workers: list[fence_op.Worker], missing: list[str]) -> None:
            result.new_workers = workers
            if not as_json and pacer.due(tuple(missing)):
                err.print(render.text(f"waiting {time.monotonic() - started:.0f} s for a new worker heartbeat of: "
                                      f"{', '.join(missing)}" if missing
                                      else "every restored function has a new worker"))

        try:
            fence_op.wait_for_heartbeats(conn, waiting, since, window=options.heartbeat_window, timeout=timeout,
                                         interval=options.interval, on_progress=on_progress)
            result.outcome = "conflict" if conflict else "confirmed"
        except DeadlineReached:
            result.outcome = "timeout"
            _finish_restore(result, page, as_json)
            raise
        except KeyboardInterrupt:
            result.outcome = "interrupted"
            _finish_restore(result, page, as_json)
            raise _interrupted("stopped waiting for heartbeats: the restore is done and stays",
                               hint="see the workers with `pgflow fence status` or SELECT * FROM pgflow.workers") from None
        _finish_restore(result, page, as_json)
        if conflict:
            raise conflict


def _finish_restore(result: fence_op.RestoreResult, page: render.Page, as_json: bool) -> None:
    if as_json:
        render.write_json(common.versioned(result.to_document(), common.STATE.target))
        return
    for worker in result.new_workers:
        page.line(f"new {worker.label()}", "green")


RESTORE_COLUMNS = (
    render.Column("function", "function", wrap=True), render.Column("outcome", "outcome"),
    render.Column("recorded", "recorded", drop=2), render.Column("now", "now"),
    render.Column("fence", "fence", drop=3), render.Column("fenced", "fenced", drop=1, wrap=True),
    render.Column("detail", "detail", wrap=True),
)
"""What a restore did; too narrow a terminal leaves out fence, recorded, fenced (when, who, why)."""
_RESTORE_STYLES = {"restored": "green", "kept_disabled": None, "conflict": "bold red"}


def _restore_style(key: str, row: Mapping[str, Any]) -> str | None:
    return _RESTORE_STYLES.get(row["outcome"]) if key == "outcome" else _bold_function(key, row)


def _print_restore(result: fence_op.RestoreResult, page: render.Page) -> None:
    title = "dry run: restore" if result.dry_run else "restore"
    page.table(RESTORE_COLUMNS, [
        {"function": change.function_name, "outcome": change.action, "recorded": _yes_no(change.previous_enabled),
         "now": _yes_no(change.enabled), "fence": f"#{change.fence_id}",
         "fenced": f"{change.fenced_at:%Y-%m-%d %H:%M:%S} by {change.fenced_by}: {change.fence_reason}"
         if change.fenced_at else "", "detail": change.detail}
        for change in result.changes], title=f"{title} of {len(result.changes)} fence(s)", style=_restore_style)


# ----------------------------------------------------------------------------------------------
# status
# ----------------------------------------------------------------------------------------------
@app.command()
@common.option_groups
def status(
    function: FunctionOption = None,
    watch: Annotated[bool, typer.Option("--watch", help="Keep refreshing until Ctrl-C.")] = False,
    heartbeat_window: WindowOption = fence_op.DEFAULT_WINDOW,
    interval: IntervalOption = 2.0,
    where: TargetOptions = ANY_TARGET,
    output_format: common.ReportFormatOption = OutputFormat.table,
) -> None:
    """Show the active fences (age, reason, who, what a restore would do) and the drain of their functions.

    Read-only. With --watch the view refreshes every --interval seconds until Ctrl-C (exit 130;
    nothing changes); with --format json --watch, one JSON document per line.

    \b
    Examples:
      pgflow fence status
      pgflow fence status --watch --interval 5
    """
    common.STATE.output_format = OutputFormat(output_format.value)
    as_json = output_format == OutputFormat.json
    with _connection(where) as conn:
        def look() -> fence_op.StatusReport:
            return fence_op.status(conn, function or None, window=heartbeat_window)

        if not watch:
            report = look()
            if as_json:
                render.write_json(common.versioned(report.to_document(), common.STATE.target))
            else:
                _print_status(report, render.Page(output_format.value))
            return
        try:
            if as_json:
                while True:
                    render.write_json(common.versioned(look().to_document(), common.STATE.target), compact=True)
                    time.sleep(interval)
            page = render.Page(output_format.value)
            while True:  # a terminal is redrawn; elsewhere one view after the other
                report = look()
                if page.console is not None and render.stdout_is_terminal():
                    page.console.clear()
                _print_status(report, page)
                time.sleep(interval)
        except KeyboardInterrupt:
            raise _interrupted("stopped watching; nothing was changed", hint="") from None




STATUS_COLUMNS = (
    render.Column("function", "function", wrap=True),
    render.Column("age", "age", drop=5),
    render.Column("by", "by", drop=3, wrap=True),
    render.Column("reason", "reason", drop=2, wrap=True),
    render.Column("recorded", "recorded", drop=4),
    render.Column("now", "now"),
    render.Column("live", "live workers", drop=1, justify="right"),
    render.Column("in_flight", "in flight", justify="right"),
    render.Column("stranded", "stranded", justify="right"),
    render.Column("outlook", "restore would", wrap=True),
)
"""The active fences; too narrow a terminal leaves out age, recorded, by, reason, live workers (in that order)."""


def _status_style(key: str, row: Mapping[str, Any]) -> str | None:
    if key == "outlook":
        return None if row["holds"] else "bold red"
    return _bold_function(key, row)


def _print_status(report: fence_op.StatusReport, page: render.Page) -> None:
    if not report.fences:
        page.line("no active fence", "green")
        return
    drain = report.drain
    rows = []
    for fence in report.fences:
        steps = [st for st in drain.steps if st.function_name == fence.function_name] if drain else []
        rows.append({
            "function": fence.function_name, "age": render.age(fence.age_seconds, minutes_in_hours=True),
            "by": fence.fenced_by + (f" via {fence.fenced_application}" if fence.fenced_application else ""),
            "reason": fence.reason, "recorded": _yes_no(fence.previous_enabled), "now": _yes_no(fence.enabled),
            "live": sum(1 for w in drain.workers if w.function_name == fence.function_name) if drain else 0,
            "in_flight": sum(st.in_flight for st in steps), "stranded": sum(st.stranded for st in steps),
            "outlook": fence.restore_outlook(), "holds": fence.holds,
        })
    page.table(STATUS_COLUMNS, rows, title=f"{len(report.fences)} active fence(s)", style=_status_style)
    if drain is not None:
        _print_drain(drain, page)

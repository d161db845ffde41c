"""``pgflow fence disable | restore | status``: the worker-function enable fence (docs/rollout.md).

Data (what changed, the final drain state) goes to stdout; the live drain view goes to stderr.
Exit codes (docs/exit-codes.md): 5 the drain or the heartbeat wait reached --timeout with work
still in flight (named on stderr); 6 a state conflict (unknown function or flow, nothing to
restore, a row changed since the fence); 130 Ctrl-C: you stopped watching, the fence stays.
"""

from __future__ import annotations

import enum
import getpass
import json
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Optional

import psycopg
import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from pgflow_cli import db, render
from pgflow_cli.cli.common import (
    STATE,
    ConnectTimeoutOption,
    DsnOption,
    OutputFormat,
    SandboxOption,
    mapped_errors,
    resolve,
    versioned,
)
from pgflow_cli.errors import DeadlineReached, ExitCode, PgflowError
from pgflow_cli.operations import fence as fence_op

app = typer.Typer(
    help="The rollout fence on worker functions: disable them (their workers refuse to register, the HTTP "
    "starter skips them), drain what their workers still run, and later restore exactly the recorded "
    "values.\n\n"
    "Typical in-place rollout: `fence disable --flow F -m WHY` (waits for the drain) -> deploy the new "
    "code -> `fence restore --flow F --wait-heartbeat`. Runbook: docs/rollout.md.",
    no_args_is_help=True,
)


class FenceFormat(str, enum.Enum):
    """Output formats of the fence commands."""

    table = "table"
    json = "json"


FormatOption = Annotated[
    FenceFormat,
    typer.Option("--format", "-f", help="Output format: table (people) or json (versioned document).",
                 case_sensitive=False),
]
FunctionOption = Annotated[
    Optional[list[str]],
    typer.Option("--function", help="A worker function (pgflow.worker_functions.function_name); repeat for several.",
                 metavar="NAME", show_default=False),
]
FlowOption = Annotated[
    Optional[list[str]],
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
def _connection(dsn: str | None, sandbox: bool, connect_timeout: int) -> Iterator[psycopg.Connection]:
    """Connect as ``pgflow fence (user@host)``, check the fence record exists, map database errors."""
    target = resolve(dsn, sandbox)
    STATE.target = target
    conn = db.connect(target, application_name=application_name(), connect_timeout=connect_timeout)
    STATE.target = target = target.connected(conn)
    try:
        with mapped_errors(target):
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
    dry_run: DryRunOption = False,
    heartbeat_window: WindowOption = fence_op.DEFAULT_WINDOW,
    interval: IntervalOption = 1.0,
    lock_timeout: LockTimeoutOption = 5.0,
    retries: RetriesOption = 5,
    dsn: DsnOption = None,
    sandbox: SandboxOption = False,
    connect_timeout: ConnectTimeoutOption = 10,
    output_format: FormatOption = FenceFormat.table,
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
    """
    STATE.output_format = OutputFormat(output_format.value)
    as_json = output_format == FenceFormat.json
    with _connection(dsn, sandbox, connect_timeout) as conn:
        selection = fence_op.select(conn, function or [], flow or [], every=every)
        result = fence_op.disable(conn, selection, reason, dry_run=dry_run, lock_timeout=lock_timeout,
                                  attempts=retries)
        if not as_json:
            _print_disable(result, render.stdout_console())
        if dry_run or detach:
            result.outcome = "dry_run" if dry_run else "detached"
            if as_json:
                render.write_json(versioned(result.to_document(), STATE.target))
            elif detach:
                render.stdout_console().print(render.text(
                    "detached: watch the drain with `pgflow fence status --watch`", "dim"))
            return
        last: list[fence_op.DrainProgress] = []
        try:
            with _live_view(not as_json) as show:
                def on_progress(progress: fence_op.DrainProgress) -> None:
                    last[:] = [progress]
                    show(progress)

                result.drain = fence_op.wait_for_drain(conn, selection.functions, window=heartbeat_window,
                                                       timeout=timeout, interval=interval, on_progress=on_progress)
            result.outcome = "drained"
        except DeadlineReached:
            result.outcome, result.drain = "timeout", (last[0] if last else None)
            _finish_disable(result, as_json)
            raise
        except KeyboardInterrupt:
            result.outcome, result.drain = "interrupted", (last[0] if last else None)
            _finish_disable(result, as_json)
            raise _interrupted(
                f"stopped watching: the fence stays in place ({len(selection.functions)} function(s) disabled, their "
                "workers deprecated); nothing was undone",
                hint=f"watch again: `pgflow fence status --watch`; undo: `{_restore_command(selection.functions)}`",
            ) from None
        _finish_disable(result, as_json)


def _finish_disable(result: fence_op.DisableResult, as_json: bool) -> None:
    if as_json:
        render.write_json(versioned(result.to_document(), STATE.target))
        return
    console = render.stdout_console()
    drain = result.drain
    if drain is not None and result.outcome == "drained":
        console.print(render.text(
            f"drained after {drain.elapsed:.1f} s: no worker of {', '.join(drain.functions)} heartbeats within "
            f"{drain.window:g} s and none of their tasks is in flight", "bold green"))
        if drain.queued:
            console.print(render.text(f"{drain.queued} queued task(s) wait for the new workers (kept durably)"))
    if drain is not None and drain.stranded:
        _print_stranded(drain, console)
    if result.outcome == "drained":
        console.print(render.text(
            "next: deploy the new code, then `" + _restore_command(result.selection.functions) + " --wait-heartbeat`",
            "bold"))


def _print_stranded(drain: fence_op.DrainProgress, console: Console) -> None:
    console.print(render.text(
        f"{drain.stranded} started task(s) are stranded (their worker stopped heartbeating); stalled recovery "
        "requeues each at its recovery time, and the new workers run it:", "yellow"))
    for task in drain.tasks:
        if not task.in_flight:
            console.print(render.text(f"  {task.label()}", "yellow"))
    listed = sum(1 for t in drain.tasks if not t.in_flight)
    if drain.stranded > listed:
        console.print(render.text(f"  ... and {drain.stranded - listed} more", "yellow"))


def _yes_no(value: bool | None) -> str:
    return "" if value is None else ("enabled" if value else "disabled")


def _print_disable(result: fence_op.DisableResult, console: Console) -> None:
    title = "dry run: would fence" if result.dry_run else "fenced"
    table = Table(title=render.text(f"{title} {len(result.changes)} worker function(s)"), title_justify="left")
    for column in ("function", "action", "before", "now", "fence", "workers deprecated", "flows served"):
        table.add_column(column, overflow="fold", no_wrap=column == "function")
    for change in result.changes:
        action = change.action if not result.dry_run else ("would fence" if change.action == "fenced" else change.action)
        now = "disabled" if result.dry_run else _yes_no(change.enabled)
        table.add_row(
            render.text(change.function_name, "bold"), render.text(action),
            render.text(_yes_no(change.previous_enabled)), render.text(now),
            render.text("" if result.dry_run or change.fence_id is None else f"#{change.fence_id}"),
            render.text(change.workers_deprecated), render.text(", ".join(result.selection.flows_of(change.function_name))),
        )
    console.print(table)
    reasons = {c.fence_reason for c in result.changes if c.fence_reason}
    if reasons and not result.dry_run:
        console.print(render.text("reason: " + " | ".join(sorted(reasons))))
    if result.deprecated:
        verb = "would deprecate" if result.dry_run else "deprecated"
        console.print(render.text(f"{verb} {len(result.deprecated)} worker(s):"))
        for worker in result.deprecated:
            console.print(render.text(f"  {worker.label()}"))
    for change in result.changes:
        if change.paused_reason:
            console.print(render.text(f"note: {change.function_name} is paused by a fatal claim: {change.paused_reason} "
                                      "(a restore keeps it disabled)", "yellow"))
        if change.action == "already_fenced":
            console.print(render.text(f"note: {change.function_name} was already fenced (fence #{change.fence_id}); "
                                      "its record is unchanged", "dim"))
    shared = [(c.function_name, result.selection.flows_of(c.function_name)) for c in result.changes]
    for name, flows in shared:
        extra = sorted(set(flows) - set(result.selection.requested_flows)) if result.selection.requested_flows else []
        if extra:
            console.print(render.text(f"note: {name} also serves {', '.join(extra)}; those flows pause too", "yellow"))


# ----------------------------------------------------------------------------------------------
# the live view (stderr)
# ----------------------------------------------------------------------------------------------
@contextmanager
def _live_view(enabled: bool) -> Iterator[Callable[[fence_op.DrainProgress], None]]:
    """A callback that shows each look: a live rich view on a terminal, a line per change elsewhere."""
    if not enabled:
        yield lambda progress: None
        return
    err = render.stderr_console()
    if not err.is_terminal:
        seen: list[tuple[Any, ...]] = []

        def line(progress: fence_op.DrainProgress) -> None:
            key = (len(progress.workers), progress.in_flight, progress.stranded, progress.queued)
            if seen and seen[-1] == key:
                return
            seen[:] = [key]
            err.print(render.text(_summary(progress)))

        yield line
        return
    with Live(console=err, refresh_per_second=4, transient=True) as live:
        yield lambda progress: live.update(_drain_view(progress))


def _summary(progress: fence_op.DrainProgress) -> str:
    return (f"{progress.state()} after {progress.elapsed:.0f} s: {len(progress.workers)} worker(s) live, "
            f"{progress.in_flight} task(s) in flight, {progress.stranded} stranded, {progress.queued} queued")


def _drain_view(progress: fence_op.DrainProgress) -> Group:
    parts: list[Any] = [render.text(_summary(progress), "bold")]
    if progress.workers:
        workers = Table(title=render.text("workers left"), title_justify="left")
        for column in ("worker", "function", "flow", "step", "heartbeat age", "deprecated"):
            workers.add_column(column)
        for w in progress.workers:
            workers.add_row(render.text(w.worker_id), render.text(w.function_name), render.text(w.flow_slug),
                            render.text(w.step_slug or "-"), render.text(f"{w.heartbeat_age:.1f} s"),
                            render.text("yes" if w.deprecated else "no"))
        parts.append(workers)
    if progress.steps:
        steps = Table(title=render.text("started tasks per step"), title_justify="left")
        for column in ("function", "flow", "step", "in flight", "stranded", "oldest"):
            steps.add_column(column)
        for s in progress.steps:
            steps.add_row(render.text(s.function_name), render.text(s.flow_slug), render.text(s.step_slug),
                          render.text(s.in_flight), render.text(s.stranded), render.text(f"{s.oldest_seconds:.0f} s"))
        parts.append(steps)
    if progress.backlog:
        backlog = Table(title=render.text("queued backlog"), title_justify="left")
        for column in ("flow", "step", "queue", "queued", "oldest"):
            backlog.add_column(column)
        for b in progress.backlog:
            backlog.add_row(render.text(b.flow_slug), render.text(b.step_slug), render.text(b.queue_name),
                            render.text(b.queued), render.text(f"{b.oldest_seconds:.0f} s"))
        parts.append(backlog)
    return Group(*parts)


# ----------------------------------------------------------------------------------------------
# restore
# ----------------------------------------------------------------------------------------------
@app.command()
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
    dry_run: DryRunOption = False,
    heartbeat_window: WindowOption = fence_op.DEFAULT_WINDOW,
    interval: IntervalOption = 1.0,
    lock_timeout: LockTimeoutOption = 5.0,
    retries: RetriesOption = 5,
    dsn: DsnOption = None,
    sandbox: SandboxOption = False,
    connect_timeout: ConnectTimeoutOption = 10,
    output_format: FormatOption = FenceFormat.table,
) -> None:
    """Lift fences: write back exactly the recorded `enabled` values where nobody changed the row since.

    A function that was disabled before the fence stays disabled. A row changed since the fence
    (enabled by hand, even if disabled again; deleted; recreated), or paused by a fatal claim during
    the fence, is left exactly as it is and reported as a conflict (exit 6); the other functions are
    restored. Every fence processed is closed and kept in pgflow.fences.

    Exit 0 restored (and, with --wait-heartbeat, each enabled function has a new worker); 5 no new
    heartbeat by --timeout; 6 a conflict, or no recorded fence for what you named; 130 Ctrl-C.
    """
    STATE.output_format = OutputFormat(output_format.value)
    as_json = output_format == FenceFormat.json
    with _connection(dsn, sandbox, connect_timeout) as conn:
        selection = fence_op.restore_selection(conn, function or [], flow or [], every)
        result = fence_op.restore(conn, selection, dry_run=dry_run, lock_timeout=lock_timeout, attempts=retries)
        if not as_json:
            _print_restore(result, render.stdout_console())
        conflict = result.conflict_error()
        waiting = result.enabled_again
        if not wait_heartbeat or dry_run or not waiting:
            if as_json:
                render.write_json(versioned(result.to_document(), STATE.target))
            if conflict:
                raise conflict
            return
        since = max(c.closed_at for c in result.changes if c.action == "restored" and c.closed_at is not None)
        result.waiting_for = list(waiting)
        err = render.stderr_console()
        seen: list[Any] = []

        def on_progress(workers: list[fence_op.Worker], missing: list[str]) -> None:
            result.new_workers = workers
            if not as_json and missing != seen:
                seen[:] = missing
                err.print(render.text(f"waiting for a new worker heartbeat of: {', '.join(missing)}" if missing
                                      else "every restored function has a new worker"))

        try:
            fence_op.wait_for_heartbeats(conn, waiting, since, window=heartbeat_window, timeout=timeout,
                                         interval=interval, on_progress=on_progress)
            result.outcome = "conflict" if conflict else "confirmed"
        except DeadlineReached:
            result.outcome = "timeout"
            _finish_restore(result, as_json)
            raise
        except KeyboardInterrupt:
            result.outcome = "interrupted"
            _finish_restore(result, as_json)
            raise _interrupted("stopped waiting for heartbeats: the restore is done and stays",
                               hint="see the workers with `pgflow fence status` or SELECT * FROM pgflow.workers") from None
        _finish_restore(result, as_json)
        if conflict:
            raise conflict


def _finish_restore(result: fence_op.RestoreResult, as_json: bool) -> None:
    if as_json:
        render.write_json(versioned(result.to_document(), STATE.target))
        return
    console = render.stdout_console()
    for worker in result.new_workers:
        console.print(render.text(f"new {worker.label()}", "green"))


def _print_restore(result: fence_op.RestoreResult, console: Console) -> None:
    title = "dry run: restore" if result.dry_run else "restore"
    table = Table(title=render.text(f"{title} of {len(result.changes)} fence(s)"), title_justify="left")
    for column in ("function", "outcome", "recorded", "now", "fence", "fenced", "detail"):
        table.add_column(column, overflow="fold", no_wrap=column == "function")
    styles = {"restored": "green", "kept_disabled": None, "conflict": "bold red"}
    for change in result.changes:
        table.add_row(
            render.text(change.function_name, "bold"), render.text(change.action, styles.get(change.action)),
            render.text(_yes_no(change.previous_enabled)), render.text(_yes_no(change.enabled)),
            render.text(f"#{change.fence_id}"),
            render.text(f"{change.fenced_at:%Y-%m-%d %H:%M:%S} by {change.fenced_by}: {change.fence_reason}"
                        if change.fenced_at else ""),
            render.text(change.detail),
        )
    console.print(table)


# ----------------------------------------------------------------------------------------------
# status
# ----------------------------------------------------------------------------------------------
@app.command()
def status(
    function: FunctionOption = None,
    watch: Annotated[bool, typer.Option("--watch", help="Keep refreshing until Ctrl-C.")] = False,
    heartbeat_window: WindowOption = fence_op.DEFAULT_WINDOW,
    interval: IntervalOption = 2.0,
    dsn: DsnOption = None,
    sandbox: SandboxOption = False,
    connect_timeout: ConnectTimeoutOption = 10,
    output_format: FormatOption = FenceFormat.table,
) -> None:
    """Show the active fences (age, reason, who, what a restore would do) and the drain of their functions.

    Read-only. With --watch the view refreshes every --interval seconds until Ctrl-C (exit 130;
    nothing changes); with --format json --watch, one JSON document per line.
    """
    STATE.output_format = OutputFormat(output_format.value)
    as_json = output_format == FenceFormat.json
    with _connection(dsn, sandbox, connect_timeout) as conn:
        def look() -> fence_op.StatusReport:
            return fence_op.status(conn, function or None, window=heartbeat_window)

        if not watch:
            report = look()
            if as_json:
                render.write_json(versioned(report.to_document(), STATE.target))
            else:
                render.stdout_console().print(_status_view(report))
            return
        try:
            if as_json:
                while True:
                    sys.stdout.write(json.dumps(json.loads(render.to_json(versioned(look().to_document(), STATE.target)))) + "\n")
                    sys.stdout.flush()
                    time.sleep(interval)
            console = render.stdout_console()
            if not console.is_terminal:
                while True:
                    console.print(_status_view(look()))
                    time.sleep(interval)
            with Live(_status_view(look()), console=console, refresh_per_second=4) as live:
                while True:
                    time.sleep(interval)
                    live.update(_status_view(look()))
        except KeyboardInterrupt:
            raise _interrupted("stopped watching; nothing was changed", hint="") from None


def _age(seconds: float) -> str:
    whole = int(seconds)
    if whole < 120:
        return f"{whole} s"
    if whole < 7200:
        return f"{whole // 60} min"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def _status_view(report: fence_op.StatusReport) -> Group:
    if not report.fences:
        return Group(render.text("no active fence", "green"))
    table = Table(title=render.text(f"{len(report.fences)} active fence(s)"), title_justify="left")
    for column in ("function", "age", "by", "reason", "recorded", "now", "live workers", "in flight", "stranded",
                   "restore would"):
        table.add_column(column, overflow="fold", no_wrap=column == "function")
    drain = report.drain
    for fence in report.fences:
        live = sum(1 for w in drain.workers if w.function_name == fence.function_name) if drain else 0
        flying = sum(s.in_flight for s in drain.steps if s.function_name == fence.function_name) if drain else 0
        stranded = sum(s.stranded for s in drain.steps if s.function_name == fence.function_name) if drain else 0
        table.add_row(
            render.text(fence.function_name, "bold"), render.text(_age(fence.age_seconds)),
            render.text(fence.fenced_by + (f" via {fence.fenced_application}" if fence.fenced_application else "")),
            render.text(fence.reason), render.text(_yes_no(fence.previous_enabled)), render.text(_yes_no(fence.enabled)),
            render.text(live), render.text(flying), render.text(stranded),
            render.text(fence.restore_outlook(), None if fence.holds else "bold red"),
        )
    parts: list[Any] = [table]
    if drain is not None:
        parts.append(_drain_view(drain))
    return Group(*parts)

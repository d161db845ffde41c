"""``pgflow runs list|show|start|wait|retry|resume|cancel``: runs, steps, tasks, attempts, errors; start a
run and await it; cancel a run, restart a failed one (docs/commands/runs.md)."""

from __future__ import annotations

import datetime as dt
import json
import sys
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from pgflow_cli import render
from pgflow_cli.cli import common
from pgflow_cli.cli.common import OutputFormat
from pgflow_cli.errors import ExitCode, UsageError
from pgflow_cli.operations import runs as runs_op
from pgflow_cli.operations.status import RUN_STATES

app = typer.Typer(
    help="Runs and what happened in them; start a run and await its end; cancel a run, retry or resume a "
    "failed one. Run inputs and message bodies "
    "are never shown; outputs only with --show-output. Wherever a RUN_ID is taken, a unique prefix of it "
    "(at least 4 hex digits) is enough.",
    no_args_is_help=True,
)


def register(root: typer.Typer) -> None:
    """Attach the ``runs`` group to the root command."""
    root.add_typer(app, name="runs")


RunIdArgument = Annotated[str, typer.Argument(
    metavar="RUN_ID", show_default=False,
    help="The run's id, or a unique prefix of it (at least 4 hex digits, as `runs list` shows them).")]


@app.command("list")
@common.option_groups
def list_(
    flow: Annotated[str | None, typer.Option("--flow", metavar="SLUG", show_default=False,
                                                help="Only runs of this flow (exact slug).")] = None,
    status: Annotated[str | None, typer.Option("--status", metavar="STATE", show_default=False,
                                                  help="Only runs in this state: " + ", ".join(RUN_STATES) + ".")]
    = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=runs_op.MAX_LIMIT, metavar="N",
                                       help="Runs per page, newest first.")] = 20,
    before: Annotated[str | None, typer.Option("--before", metavar="RUN_ID", show_default=False,
                                                  help="The next page: runs started before this run (the id "
                                                  "the previous page's `next:` line gives, or a unique prefix).")]
    = None,
    output_format: common.ReportFormatOption = OutputFormat.table,
    where: common.TargetOptions = common.ANY_TARGET,
) -> None:
    """List runs, newest first.

    Exit 0: listed (also when none matched). Exit 2: a bad --status, --limit or --before. Exit 3: cannot
    connect or no pgflow schema. Exit 6: --flow or --before names nothing.

    \b
    Examples:
      pgflow runs list --flow orders --status failed
      pgflow runs list --limit 50 --format json
    """
    with where.connected() as (conn, target):
        page = runs_op.list_runs(conn, flow=flow, status=status, limit=limit, before=before)
        if output_format == OutputFormat.json:
            render.write_json(common.versioned(page.to_document(), target))
            return
    show_page(page, render.Page(output_format.value))


RUN_COLUMNS = (
    render.Column("run_id", "run id"),
    render.Column("flow", "flow", drop=1, wrap=True),
    render.Column("status", "status"),
    render.Column("started", "started (UTC)"),
    render.Column("ended", "ended (UTC)", drop=3),
    render.Column("failed_steps", "failed steps", drop=2),
)
"""A page of runs; too narrow a terminal leaves out ended, failed steps, flow (in that order)."""


def show_page(page: runs_op.RunPage, out: render.Page) -> None:
    """Render a page of runs in ``out``'s format; the ``next:`` line repeats the target option given
    (:func:`common.with_target`).

    Args:
        page: the runs (:func:`pgflow_cli.operations.runs.list_runs`).
        out: the page to write (``table``, ``plain`` or ``markdown``).
    """
    out.table(RUN_COLUMNS, [
        {"run_id": r.run_id, "flow": r.flow_slug, "status": r.status, "started": _when(r.started_at),
         "ended": _when(r.completed_at or r.failed_at), "failed_steps": f"{r.failed_steps} of {r.steps}"}
        for r in page.runs], title="runs, newest first")
    out.line(f"{len(page.runs)} run(s)" + ("" if page.next_before else "; no more"), "dim")
    if page.next_before:
        options = "".join(f" --{k} {v}" for k, v in (("flow", page.flow), ("status", page.status)) if v)
        limit = f" --limit {page.limit}" if page.limit != 20 else ""
        out.line(common.with_target(f"next: pgflow runs list{options}{limit} --before {page.next_before}"), "dim")


@app.command("show")
@common.option_groups
def show(
    run_id: RunIdArgument,
    show_output: Annotated[bool, typer.Option("--show-output",
                                              help="Also show the outputs of the run, its steps and tasks.")] = False,
    max_tasks: Annotated[int, typer.Option("--max-tasks", min=1, metavar="N",
                                           help="Show at most N tasks (a map step may have thousands).")] = 200,
    output_format: common.ReportFormatOption = OutputFormat.table,
    where: common.TargetOptions = common.ANY_TARGET,
) -> None:
    """Show one run: its steps, tasks, attempts and errors (outputs only with --show-output).

    Exit 0: shown. Exit 2: RUN_ID is neither a run id nor a unique prefix of one. Exit 3: cannot connect or no
    pgflow schema. Exit 6: no such run.

    \b
    Examples:
      pgflow runs show 74d94235-acf2-4bcc-bb3a-0e6f0176b324
      pgflow runs show 74d94235 --show-output
    """
    runs_op.parse_run_ref(run_id)  # a bad id is a usage error before any connection
    with where.connected() as (conn, target):
        detail = runs_op.show_run(conn, run_id, show_output=show_output, max_tasks=max_tasks)
        if output_format == OutputFormat.json:
            render.write_json(common.versioned(detail.to_document(), target))
            return
    show_detail(detail, render.Page(output_format.value))


def _step_columns(show_output: bool) -> list[render.Column]:
    return [render.Column("step", "step", wrap=True), render.Column("type", "type", drop=1),
            render.Column("status", "status"), render.Column("tasks", "tasks"),
            render.Column("max_attempts", "max attempts", drop=2, justify="right"),
            render.Column("error", "error", wrap=True)] + (
        [render.Column("output", "output", drop=3, wrap=True)] if show_output else [])


def _task_columns(show_output: bool) -> list[render.Column]:
    return [render.Column("step", "step", wrap=True), render.Column("task", "task", justify="right"),
            render.Column("status", "status"), render.Column("attempts", "attempts", justify="right"),
            render.Column("requeued", "requeued", drop=1, justify="right"),
            render.Column("message", "message", drop=2, justify="right"),
            render.Column("error", "error", wrap=True)] + (
        [render.Column("output", "output", drop=3, wrap=True)] if show_output else [])


def show_detail(detail: runs_op.RunDetail, out: render.Page) -> None:
    """Render one run in ``out``'s format: a run line, then its steps and its tasks.

    Args:
        detail: the run (:func:`pgflow_cli.operations.runs.show_run`); outputs only when it holds them.
        out: the page to write (``table``, ``plain`` or ``markdown``).
    """
    run = detail.run
    ended = run["completed_at"] or run["failed_at"]
    out.line(f"run {run['run_id']} of flow {run['flow_slug']}: {run['status']}", "bold")
    out.line(f"started {_when(run['started_at'])} UTC" + (f", ended {_when(ended)} UTC" if ended else "")
             + f"; {run['remaining_steps']} step(s) remaining", "bold")
    if run.get("restart_of_run_id"):
        out.line(f"{run['restart_kind']} of run {run['restart_of_run_id']}")
    if run.get("cancelled_at"):
        out.line(f"cancelled {_when(run['cancelled_at'])} UTC by {run['cancelled_by']}: {run['cancel_reason']}")
    if detail.restarted_as:
        out.line("restarted as: " + ", ".join(f"{r['run_id']} ({r['restart_kind']}, {r['status']})"
                                              for r in detail.restarted_as))
    if detail.show_output:
        out.line(f"output: {_json_text(run.get('output'))}", "bold")

    def outputs(row: dict[str, Any]) -> dict[str, str]:
        return {"output": _json_text(row.get("output"))} if detail.show_output else {}

    out.table(_step_columns(detail.show_output), [
        {"step": s["step_slug"], "type": s["step_type"],
         "status": s["status"] + (f" ({s['skip_reason']})" if s["skip_reason"] else ""),
         "tasks": "-" if s["remaining_tasks"] is None
         else f"{s['initial_tasks'] - s['remaining_tasks']}/{s['initial_tasks']} done",
         "max_attempts": s["max_attempts"], "error": s["error_message"] or "-", **outputs(s)}
        for s in detail.steps], title="steps")
    out.table(_task_columns(detail.show_output), [
        {"step": t["step_slug"], "task": t["task_index"], "status": _task_state(t), "attempts": t["attempts_count"],
         "requeued": t["requeued_count"], "message": t["message_id"] if t["message_id"] is not None else "-",
         "error": t["error_message"] or "-", **outputs(t)}
        for t in detail.tasks], title="tasks")
    if detail.tasks_total > len(detail.tasks):
        out.line(f"{detail.tasks_total - len(detail.tasks)} more task(s) not shown (--max-tasks)", "dim")


START_HELP = """Start a run of FLOW with a JSON input; with --wait, await its end.

The input is JSON text, @FILE (the text of a file) or @- (standard input). It is checked the way
PostgreSQL's jsonb reads it before anything is sent: a NUL character (\\u0000), a lone surrogate, a
number outside numeric or nesting deeper than 512 levels is refused with the path of the bad value. A
flow with a root map step takes a JSON array.

While waiting, a line on stderr says where the run stands, at least every 5 seconds. The run goes on in
the database whatever happens to this command (Ctrl-C, --timeout); `pgflow runs wait RUN_ID` awaits it
again.

Exit 0: started (with --wait: completed). Exit 1: the run failed (--wait). Exit 2: bad options, an input
that is not JSON or that PostgreSQL or the flow cannot take. Exit 3: cannot connect. Exit 5: --timeout
passed before the run ended (it goes on). Exit 6: no such flow.

\b
Examples:
  pgflow runs start greetUser --input '{"first": "Ada", "last": "Lovelace"}'
  pgflow runs start greetUser --input @input.json --wait --timeout 60
  pgflow runs start greetUser --input @- --wait --show-output --format json < input.json"""

WAIT_HELP = """Await the end of a run; print how it ended (its failed steps and their errors).

RUN_ID is a run id or a unique prefix of one. A line on stderr says where the run stands at least every
5 seconds; an ended run is reported at once. The run goes on whatever happens to this command.

Exit 0: the run completed. Exit 1: it failed. Exit 2: RUN_ID is neither a run id nor a unique prefix (an
ambiguous prefix lists its matches). Exit 3: cannot connect (or the connection was lost for 30 s). Exit 5:
--timeout passed first. Exit 6: no such run.

\b
Examples:
  pgflow runs wait 6f1c2a9e
  pgflow runs wait 6f1c2a9e --timeout 300 --show-output --format json"""

@dataclass(frozen=True)
class WaitOptions:
    """``--timeout`` and ``--show-output``: how ``runs start --wait`` and ``runs wait`` await a run."""

    timeout: Annotated[float | None, typer.Option(
        "--timeout", min=0, metavar="SECONDS", show_default=False,
        help="Stop waiting after this many seconds (exit 5); the run goes on. Default: until it ends.")] = None
    show_output: Annotated[bool, typer.Option(
        "--show-output", help="Also show the output of a completed run (it may hold your application's data).")] \
        = False


ANY_WAIT = WaitOptions()


@app.command("start", help=START_HELP)
@common.option_groups
def start(
    flow: Annotated[str, typer.Argument(metavar="FLOW", help="The flow's slug (exact).", show_default=False)],
    run_input: Annotated[str, typer.Option(
        "--input", "-i", metavar="JSON|@FILE",
        help="The run input: JSON text, @FILE to read it from a file, @- from standard input.")] = "{}",
    wait: Annotated[bool, typer.Option("--wait", help="Await the run's end and report it (exit 0 completed, "
                                       "1 failed, 5 --timeout passed).")] = False,
    waiting: WaitOptions = ANY_WAIT,
    output_format: common.ReportFormatOption = OutputFormat.table,
    where: common.TargetOptions = common.ANY_TARGET,
) -> None:
    if not wait and waiting != ANY_WAIT:
        raise UsageError(f"{'--timeout' if waiting.timeout is not None else '--show-output'} needs --wait",
                         hint="add --wait, or await the run later with `pgflow runs wait RUN_ID`")
    value = runs_op.read_input(run_input, sys.stdin.read)
    with where.connected() as (conn, target):
        report = runs_op.start_run(conn, flow, value)
    if wait:
        render.stderr_console().print(render.text(
            f"started run {report.run['run_id']} of flow {flow}; waiting (Ctrl-C stops waiting, not the run)"))
        report = _await(report, where, target, waiting)
    _emit(report, output_format, target)


@app.command("wait", help=WAIT_HELP)
@common.option_groups
def wait_(
    run_id: RunIdArgument,
    waiting: WaitOptions = ANY_WAIT,
    output_format: common.ReportFormatOption = OutputFormat.table,
    where: common.TargetOptions = common.ANY_TARGET,
) -> None:
    runs_op.parse_run_ref(run_id)
    with where.connected() as (conn, target):
        report = runs_op.RunReport(runs_op.WAIT_KIND, runs_op.read_run(conn, run_id))
    _emit(_await(report, where, target, waiting), output_format, target)


def _await(report: runs_op.RunReport, where: common.TargetOptions, target: Any, waiting: WaitOptions
           ) -> runs_op.RunReport:
    progress_console = render.stderr_console()

    def progress(state: Any, waited: float) -> None:
        progress_console.print(render.text(
            f"waiting for run {report.run['run_id']}: {state.describe()} (waited {render.span(waited)})", "dim"))

    with common.mapped_errors(target):
        return runs_op.await_run(target, report, timeout=waiting.timeout, show_output=waiting.show_output,
                                 on_progress=progress,
                                 connect_timeout=where.connect_timeout)


FAILURE_COLUMNS = (
    render.Column("step", "step", wrap=True),
    render.Column("task", "task", justify="right"),
    render.Column("attempts", "attempts", drop=1, justify="right"),
    render.Column("error", "error", wrap=True),
)
"""A failed run's failed tasks (a step that failed without a failed task: its own error)."""


def _emit(report: runs_op.RunReport, output_format: OutputFormat, target: Any) -> None:
    if output_format == OutputFormat.json:
        render.write_json(common.versioned(report.to_document(), target))
    else:
        show_report(report, render.Page(output_format.value))
    if report.outcome == "failed":
        raise typer.Exit(int(ExitCode.FINDINGS))
    if report.outcome == "deadline":
        raise typer.Exit(int(ExitCode.DEADLINE))


def show_report(report: runs_op.RunReport, out: render.Page) -> None:
    """Render what ``runs start`` / ``runs wait`` report in ``out``'s format.

    Args:
        report: the run and how the wait ended (:func:`pgflow_cli.operations.runs.await_run`).
        out: the page to write (``table``, ``plain`` or ``markdown``).
    """
    run = report.run
    head = f"run {run['run_id']} of flow {run['flow_slug']}"
    if not report.waited:
        out.line(f"started {head}: {run['status']}, {run['remaining_steps']} step(s) remaining", "bold")
        out.line(common.with_target(f"next: pgflow runs wait {run['run_id']}"), "dim")
        return
    waited = f"{report.waited_seconds or 0:.1f} s"
    if report.outcome == "deadline":
        out.line(f"{head}: still {run['status']} after waiting {waited} (--timeout); "
                 f"{run['remaining_steps']} step(s) remaining", "bold")
        out.line(common.with_target(f"next: pgflow runs wait {run['run_id']}"), "dim")
        return
    out.line(f"{head}: {report.outcome} (waited {waited})", "bold")
    if report.outcome == "completed":
        if report.show_output:
            out.line(f"output: {_json_text(report.output)}")
        return
    rows = [{"step": f["step_slug"], "task": t["task_index"], "attempts": t["attempts_count"],
             "error": t["error_message"] or f["error_message"] or "-"}
            for f in report.failures for t in f["tasks"]]
    rows += [{"step": f["step_slug"], "task": "-", "attempts": "-", "error": f["error_message"] or "-"}
             for f in report.failures if not f["tasks"]]
    out.table(FAILURE_COLUMNS, rows, title="failed steps")
    out.line(common.with_target(f"next: pgflow runs show {run['run_id']}"), "dim")


def _task_state(task: dict[str, Any]) -> str:
    state = str(task["status"])
    if task["permanently_stalled_at"] is not None:
        state += " (stalled, given up)"
    if task["execution_mode"] == "manual":
        state += " (manual)"
    if task.get("failed_now"):
        state += " (fail-now)"
    elif task.get("requested_retry_delay") is not None and task["status"] in ("queued", "failed"):
        # asked with the latest failure; on the last attempt it was not applied
        state += f" (retry in {task['requested_retry_delay']}s asked)"
    if task.get("refused_reports"):
        state += f" ({task['refused_reports']} late report(s) refused)"
    return state


def _when(value: Any) -> str:
    return "-" if value is None else value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _json_text(value: Any) -> str:
    return "-" if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


RETRY_HELP = """Retry a failed (or cancelled) run as a fresh run of the same flow and input.

Nothing of the failed run is reused: every step runs again. The new run names the failed one
(restart_of_run_id, shown by `runs show`); the failed run is not changed and may be retried again.
Needs an operator role: the owner of the pgflow tables or a member of pgflow_operator
(docs/permissions.md "Run operators").

Exit 0: the new run started. Exit 2: RUN_ID is neither a run id nor a unique prefix, or the flow as
compiled now cannot take the input. Exit 3: cannot connect, not an operator, or a schema before
migration 0003. Exit 6: no such run, or it is not failed (still started, or completed).

\b
Examples:
  pgflow runs retry 6f1c2a9e
  pgflow runs retry 6f1c2a9e --format json"""

RESUME_HELP = """Resume a failed (or cancelled) run: a new run that reuses every task the failed run completed.

Map elements included: a map step with 9 of 10 elements done queues only the tenth. Only the unfinished
tasks and what depends on them run; conditions and empty maps are decided again as on a fresh run. A
task is reused only when its step's dependencies ended exactly as in the failed run. The new run names
the failed one (restart_of_run_id); the failed run is not changed. Needs an operator role (as retry).

Exit 0: the new run started. Exit 2: a bad RUN_ID, or an input the flow cannot
take. Exit 3: cannot connect, not an operator, or a schema before migration 0003. Exit 6: no such run;
it is not failed; or its flow was compiled again since it started (retry it instead).

\b
Examples:
  pgflow runs resume 6f1c2a9e
  pgflow runs resume 6f1c2a9e --format json"""

CANCEL_HELP = """Cancel a started run: it ends failed, with the reason recorded.

Every queued or started task of the run, manual ones included, is cancelled and its message archived;
a handler still running finds out at its worker's next heartbeat (its stop signal), and its result,
when it comes, is refused and counted on its task (`runs show`). On a terminal you are asked to type
the first 8 characters of the run id; --yes does not ask (required when there is no terminal).
Cancelling a run cancelled already changes nothing. Needs an operator role (docs/permissions.md
"Run operators").

Exit 0: cancelled (or cancelled already). Exit 2: a bad RUN_ID or --reason, or no terminal and no --yes.
Exit 3: cannot connect, not an operator, or a schema before migration 0003. Exit 6: no such run, or it
already completed or failed. Exit 130: the confirmation was declined; nothing changed.

\b
Examples:
  pgflow runs cancel 6f1c2a9e --reason "wrong input file"
  pgflow runs cancel 6f1c2a9e --yes --format json"""


@app.command("retry", help=RETRY_HELP)
@common.option_groups
def retry(
    run_id: RunIdArgument,
    output_format: common.ReportFormatOption = OutputFormat.table,
    where: common.TargetOptions = common.ANY_TARGET,
) -> None:
    _restart(run_id, resume=False, output_format=output_format, where=where)


@app.command("resume", help=RESUME_HELP)
@common.option_groups
def resume(
    run_id: RunIdArgument,
    output_format: common.ReportFormatOption = OutputFormat.table,
    where: common.TargetOptions = common.ANY_TARGET,
) -> None:
    _restart(run_id, resume=True, output_format=output_format, where=where)


def _restart(run_id: str, *, resume: bool, output_format: OutputFormat, where: common.TargetOptions) -> None:
    runs_op.parse_run_ref(run_id)
    with where.connected() as (conn, target):
        report = runs_op.restart_run(conn, run_id, resume=resume)
    if output_format == OutputFormat.json:
        render.write_json(common.versioned(report.to_document(), target))
        return
    show_restart(report, render.Page(output_format.value))


def show_restart(report: runs_op.RestartReport, out: render.Page) -> None:
    """Render what ``runs retry`` / ``runs resume`` report in ``out``'s format.

    Args:
        report: the source and the new run (:func:`pgflow_cli.operations.runs.restart_run`).
        out: the page to write (``table``, ``plain`` or ``markdown``).
    """
    run, verb = report.run, "resumed" if report.kind == runs_op.RESUME_KIND else "retried"
    out.line(f"{verb} run {report.source['run_id']} of flow {run['flow_slug']} as run {run['run_id']}: "
             f"{run['status']}", "bold")
    reused = f"reused {report.reused_tasks} completed task(s), " if report.kind == runs_op.RESUME_KIND else ""
    out.line(f"{reused}queued {report.queued_tasks} task(s); {run['remaining_steps']} step(s) remaining")
    out.line(common.with_target(f"next: pgflow runs wait {run['run_id']}"), "dim")


@app.command("cancel", help=CANCEL_HELP)
@common.option_groups
def cancel(
    run_id: RunIdArgument,
    reason: Annotated[str | None, typer.Option(
        "--reason", metavar="TEXT", show_default=False,
        help="Why (recorded with the run, at most 1000 characters). Default: \"cancelled by <role>\".")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    output_format: common.ReportFormatOption = OutputFormat.table,
    where: common.TargetOptions = common.ANY_TARGET,
) -> None:
    runs_op.parse_run_ref(run_id)
    if reason is not None and not reason.strip():
        raise UsageError("--reason is empty", hint="say why, or leave --reason out")
    if reason is not None and len(reason) > runs_op.MAX_CANCEL_REASON:
        raise UsageError(f"--reason is {len(reason)} characters long; at most {runs_op.MAX_CANCEL_REASON} are kept")
    if not yes and not sys.stdin.isatty():
        raise UsageError("runs cancel ends a run: on no terminal, confirm with --yes",
                         hint="or run it on a terminal and type the run id's first 8 characters when asked")
    with where.connected() as (conn, target):
        preview = runs_op.cancel_preview(conn, run_id)
        if not yes:
            _confirm_cancel(preview)
        report = runs_op.cancel_run(conn, preview.run["run_id"], reason)
    if output_format == OutputFormat.json:
        render.write_json(common.versioned(report.to_document(), target))
        return
    show_cancel(report, render.Page(output_format.value))


def _confirm_cancel(preview: runs_op.CancelPreview) -> None:
    err = render.stderr_console()
    run = preview.run
    err.print(render.text(f"run {run['run_id']} of flow {run['flow_slug']}: {run['status']}, "
                          f"{run['remaining_steps']} step(s) remaining; {preview.queued} queued, {preview.running} "
                          f"running and {preview.manual} manual task(s) would be cancelled. It cannot be undone "
                          "(a failed run can be retried or resumed).", "bold"))
    try:
        answer = typer.prompt("Type the run id's first 8 characters to cancel it", default="", show_default=False,
                              err=True)
    except (EOFError, typer.Abort):
        answer = None
    if answer is None or answer.strip().lower() != run["run_id"][:8]:
        err.print(render.text("not cancelled: the characters did not match; nothing changed", "yellow"))
        raise typer.Exit(int(ExitCode.INTERRUPTED))


def show_cancel(report: runs_op.CancelReport, out: render.Page) -> None:
    """Render what ``runs cancel`` reports in ``out``'s format.

    Args:
        report: the run after the cancel (:func:`pgflow_cli.operations.runs.cancel_run`).
        out: the page to write (``table``, ``plain`` or ``markdown``).
    """
    run = report.run
    head = f"run {run['run_id']} of flow {run['flow_slug']}"
    if report.already:
        out.line(f"{head} was cancelled already, at {_when(run['cancelled_at'])} UTC by {run['cancelled_by']}: "
                 f"{run['cancel_reason']}; nothing changed", "bold")
    else:
        out.line(f"cancelled {head}: {run['cancel_reason']}; {report.tasks_cancelled} task(s) cancelled", "bold")
    out.line(common.with_target(f"next: pgflow runs show {run['run_id']}, or pgflow runs resume {run['run_id']}"), "dim")

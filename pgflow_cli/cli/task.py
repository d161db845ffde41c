"""``pgflow task list|show|complete|fail``: manual tasks for operators (docs/manual-tasks.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import psycopg
import typer

from pgflow_cli import jsoncheck, render
from pgflow_cli.cli import common
from pgflow_cli.cli.common import ANY_TARGET, OutputFormat, TargetOptions
from pgflow_cli.errors import UsageError
from pgflow_cli.operations import manual_tasks as op
from pgflow_cli.operations import runs as runs_op

HELP = """Manual tasks: the tasks of queue-less steps (Flow.step(..., manual=True)) that trusted code
completes or fails instead of a worker (pgflow.complete_manual_task / pgflow.fail_manual_task).

`list` shows waiting tasks with their age, run and step (`--older-than 1h` for overdue ones);
`show` one task; `complete` / `fail` record its outcome in one transaction and run the workflow
on (a repeated identical call changes nothing). Task inputs and outputs are never printed.

Exit 0: done. Exit 2: bad arguments. Exit 3: cannot connect. Exit 6: no such task (PF009), not a
manual task (PF010), no longer active (PF011), or a conflicting outcome (PF012). Details:
docs/manual-tasks.md."""

app = typer.Typer(help=HELP, no_args_is_help=True, rich_markup_mode=None)

CSV_COLUMNS = ["run_id", "flow_slug", "step_slug", "task_index", "status", "step_type", "run_status", "step_status",
               "started_at", "age_seconds", "completed_at", "failed_at", "error_message"]
"""One CSV row per task, in this column order."""

RunArg = Annotated[str, typer.Argument(help="Run id, or a unique prefix of it (at least 4 hex digits).",
                                       metavar="RUN_ID", show_default=False)]
StepArg = Annotated[str, typer.Argument(help="Step slug.", metavar="STEP", show_default=False)]
IndexOption = Annotated[
    int, typer.Option("--index", "-i", min=0, help="Task index: 0 for a single step, the item index of a map step.")
]


@dataclass(frozen=True)
class TaskKey:
    """The task ``show``, ``complete`` and ``fail`` act on: ``RUN_ID STEP [--index N]``."""

    run_id: RunArg
    step: StepArg
    index: IndexOption = 0


def register(app_root: typer.Typer) -> None:
    """Attach ``task`` to the root command."""
    app_root.add_typer(app, name="task")


def _run(where: TargetOptions, action: Callable[[psycopg.Connection], list[op.ManualTask]]) -> list[op.ManualTask]:
    with where.connected() as (conn, _target):
        return action(conn)


def _emit(tasks: list[op.ManualTask], output_format: OutputFormat, title: str) -> None:
    if output_format == OutputFormat.json:
        render.write_json(common.versioned(op.document(tasks), common.STATE.target))
        return
    if output_format == OutputFormat.csv:
        render.write_csv(CSV_COLUMNS, [t.to_dict() for t in tasks])
        return
    page = render.Page(output_format.value)
    if not tasks:
        page.line(title + ": none")
        return
    rows = [{"run": t.run_id, "flow": t.flow_slug, "step": t.step_slug, "index": t.task_index, "status": t.status,
             "waited": render.span(t.age_seconds, compact=True), "run_step": f"{t.run_status}/{t.step_status}", "error": t.error_message}
            for t in tasks]
    page.table(TASK_COLUMNS, rows, title=title)


TASK_COLUMNS = [
    render.Column("run", "run"),
    render.Column("flow", "flow"),
    render.Column("step", "step"),
    render.Column("index", "index", drop=3, justify="right"),
    render.Column("status", "status"),
    render.Column("waited", "waited"),
    render.Column("run_step", "run/step", drop=2),
    render.Column("error", "error", drop=1, wrap=True),
]
"""``task list``: run, flow, step, status and age always; run/step state and the error go first when narrow."""




@app.command("list")
@common.option_groups
def list_tasks(
    where: TargetOptions = ANY_TARGET,
    output_format: common.FormatOption = OutputFormat.table,
    flow: Annotated[str | None, typer.Option("--flow", help="Only this flow (exact slug).", metavar="SLUG")] = None,
    older_than: Annotated[
        str | None,
        typer.Option("--older-than", help="Only tasks waiting longer than this (90, 15m, 2h, 1d).", metavar="DURATION"),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10000, help="At most this many tasks.")] = 100,
) -> None:
    """Waiting manual tasks, oldest first, with their age, run and step.

    \b
    Examples:
      pgflow task list
      pgflow task list --flow review --older-than 1h
    """
    common.STATE.output_format = output_format
    seconds = common.parse_duration(older_than, "--older-than") if older_than is not None else None
    tasks = _run(where,
                 lambda conn: op.list_waiting(conn, flow_slug=flow, older_than=seconds, limit=limit))
    _emit(tasks, output_format, "waiting manual tasks")


@app.command("show")
@common.option_groups
def show_task(
    task: TaskKey,
    where: TargetOptions = ANY_TARGET,
    output_format: common.FormatOption = OutputFormat.table,
) -> None:
    """One manual task by run id, step and index, whatever its state.

    \b
    Examples:
      pgflow task show 74d94235-acf2-4bcc-bb3a-0e6f0176b324 approve
    """
    common.STATE.output_format = output_format
    tasks = _run(where, lambda conn: [op.show(conn, runs_op.resolve_run_id(conn, task.run_id), task.step, task.index)])
    _emit(tasks, output_format, "manual task")


def _output_value(output: str | None, output_file: Path | None) -> Any:
    if (output is None) == (output_file is None):
        raise UsageError("give the task output with exactly one of --output JSON or --output-file PATH")
    try:
        text = output if output is not None else output_file.read_text(encoding="utf-8")  # type: ignore[union-attr]
    except OSError as exc:
        raise UsageError(f"cannot read {output_file}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"--output-file {output_file} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    jsoncheck.parse_text(text, what="--output" if output is not None else str(output_file))
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"the output is not valid JSON: {exc}") from None


@app.command("complete")
@common.option_groups
def complete_task(
    task: TaskKey,
    output: Annotated[str | None, typer.Option("--output", help="The task output, JSON text.", metavar="JSON")] = None,
    output_file: Annotated[
        Path | None, typer.Option("--output-file", help="Read the JSON output from this file.", metavar="PATH")
    ] = None,
    where: TargetOptions = ANY_TARGET,
    output_format: common.FormatOption = OutputFormat.table,
) -> None:
    """Complete a waiting manual task with a JSON output; the workflow moves on in the same transaction.

    \b
    Examples:
      pgflow task complete 74d94235-acf2-4bcc-bb3a-0e6f0176b324 approve --output '{"approved": true}'
      pgflow task complete 74d94235-acf2-4bcc-bb3a-0e6f0176b324 pack --index 3 --output-file out.json
    """
    common.STATE.output_format = output_format
    value = _output_value(output, output_file)
    tasks = _run(where, lambda conn: [op.complete(conn, runs_op.resolve_run_id(conn, task.run_id), task.step,
                                                  task.index, value)])
    _emit(tasks, output_format, "completed manual task")


@app.command("fail")
@common.option_groups
def fail_task(
    task: TaskKey,
    error: Annotated[str, typer.Option("--error", help="Why the task failed (stored on the task and step).",
                                       metavar="TEXT", show_default=False)] = "",
    where: TargetOptions = ANY_TARGET,
    output_format: common.FormatOption = OutputFormat.table,
) -> None:
    """Fail a waiting manual task (no retry); the step's when_exhausted decides what follows.

    \b
    Examples:
      pgflow task fail 74d94235-acf2-4bcc-bb3a-0e6f0176b324 approve --error 'rejected by finance'
    """
    common.STATE.output_format = output_format
    jsoncheck.check_text(error, what="--error")
    tasks = _run(where, lambda conn: [op.fail(conn, runs_op.resolve_run_id(conn, task.run_id), task.step, task.index,
                                              error)])
    _emit(tasks, output_format, "failed manual task")

"""``pgflow prune --older-than DURATION``: bounded history, in short batches (docs/commands/prune.md)."""

from __future__ import annotations

import sys
import time
from typing import Annotated

import psycopg
import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from pgflow_cli import render
from pgflow_cli.cli import common
from pgflow_cli.cli.common import ANY_TARGET, OutputFormat, TargetOptions
from pgflow_cli.errors import ExitCode, PgflowError, UsageError
from pgflow_cli.operations import prune as op

HELP = """Delete history older than DURATION, in short batches: finished runs (completed or failed
before the cutoff) with their step states and tasks, worker rows without a heartbeat since the
cutoff and without a task in flight, and the PGMQ archive rows of pgflow's queues archived before it.

Never touches a started run, a finished run that still has a queued or started task, a flow, a step,
a queued message, or a run a worker holds at that moment (it is left for the next prune). Each batch
is one short transaction (so it also works through PgBouncer in transaction mode); a prune that was
stopped is finished by running it again. Asks you to type the DURATION again after showing the counts;
without a terminal, pass --yes. Read docs/commands/prune.md before scheduling it.

Exit 0 pruned (or --dry-run); 2 usage (bad DURATION, --yes missing off a terminal); 3 cannot connect,
no migration 0003, or not allowed; 4 a batch kept meeting a lock (the batches before it stay
committed); 130 interrupted or confirmation declined (committed batches stay: run it again).

\b
Examples:
  pgflow prune --older-than 30d --dry-run
  pgflow prune --older-than 30d
  pgflow prune --older-than 90d --yes --format json"""


def register(app: typer.Typer) -> None:
    """Attach ``prune`` to the root command."""
    app.command("prune", help=HELP)(common.option_groups(prune))


def prune(
    older_than: Annotated[str, typer.Option(
        "--older-than", metavar="DURATION", show_default=False,
        help="Prune what ended this long ago or earlier (90, 15m, 2h, 30d; at least 60 s).")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would be deleted; change nothing.")] = False,
    batch_size: Annotated[int, typer.Option(
        "--batch-size", metavar="N", help="Runs per batch (1-10000), each with its step states and tasks; "
        "lower it for flows with big map steps.")] = 500,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask (required when not on a terminal).")] = False,
    lock_timeout: Annotated[float, typer.Option(
        "--lock-timeout", min=0.1, metavar="SECONDS",
        help="Seconds a batch may wait for a lock before it is retried.")] = 5.0,
    output_format: common.ReportFormatOption = OutputFormat.table,
    where: TargetOptions = ANY_TARGET,
) -> None:
    seconds = common.parse_duration(older_than, "--older-than")
    op.check_options(seconds, batch_size)
    interactive = not (yes or dry_run)
    if interactive and not sys.stdin.isatty():
        raise UsageError("prune deletes history: off a terminal, confirm with --yes",
                         hint=common.with_target(f"look first: pgflow prune --older-than {older_than} --dry-run"))
    err = render.stderr_console()
    show_progress = err.is_terminal
    preview = None
    with where.connected() as (conn, target):
        if output_format.human:
            err.print(render.text(f"{'counting' if dry_run or interactive else 'pruning'} history older than "
                                  f"{older_than} on {target.describe()}", "dim"))
        if interactive:
            preview = _run(conn, seconds, batch_size, True, lock_timeout, err, show_progress)
            _render(preview, render.Page(output_format.value) if output_format.human else None, err)
            if not (preview.totals.runs or preview.totals.workers or preview.totals.archived_messages):
                err.print(render.text("nothing to prune", "green"))
                report = preview
            else:
                _ask(older_than, err)
                report = _run(conn, seconds, batch_size, False, lock_timeout, err, show_progress)
        else:
            report = _run(conn, seconds, batch_size, dry_run, lock_timeout, err, show_progress)
    if output_format == OutputFormat.json:
        render.write_json(common.versioned(report.to_document(), target))
    elif report is not preview:
        _render(report, render.Page(output_format.value), err)


def _run(conn: psycopg.Connection, seconds: float, batch_size: int, dry_run: bool, lock_timeout: float, err: Console,
         show_progress: bool) -> op.PruneReport:
    """One pass (dry or not), with a progress line on a terminal; Ctrl-C says what stays done."""
    seen: list[op.Progress] = []
    verb = "counted" if dry_run else "deleted"

    def on_retry(attempt: int, error: BaseException, delay: float) -> None:
        err.print(render.text(f"batch attempt {attempt}: {str(error).strip().splitlines()[0]}; rolled back, "
                              f"retrying in {delay:.1f}s", "yellow"))

    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                        transient=True, disable=not show_progress, refresh_per_second=2)
    task = progress.add_task("starting", total=None)

    def on_progress(p: op.Progress) -> None:
        seen[:] = [p]
        t = p.totals
        where = f" {p.detail}" if p.detail else ""
        progress.update(task, description=(
            f"{p.phase}{where}: {verb} {t.runs:,} runs, {t.step_tasks:,} tasks, {t.workers:,} workers, "
            f"{t.archived_messages:,} archived messages · {t.scanned:,} runs scanned · {t.batches:,} batches"))

    started = time.monotonic()
    try:
        with progress:
            return op.prune(conn, older_than=seconds, batch_size=batch_size, dry_run=dry_run,
                            on_progress=on_progress, lock_timeout=lock_timeout, on_retry=on_retry)
    except KeyboardInterrupt:
        done = seen[0].totals if seen else op.Totals()
        raise PgflowError(
            f"interrupted after {time.monotonic() - started:.1f} s: "
            + ("nothing was changed" if dry_run else
               f"{done.runs:,} runs, {done.workers:,} worker rows and {done.archived_messages:,} archive rows "
               "deleted in committed batches stay deleted; the batch in progress was rolled back"),
            hint="" if dry_run else "run the same command again to finish: it continues where the history is",
            exit_code=ExitCode.INTERRUPTED) from None


def _ask(older_than: str, err: Console) -> None:
    err.print(render.text("This deletes the history counted above. It cannot be undone.", "bold"))
    try:
        answer = typer.prompt(f"Type the duration ({older_than}) to prune", default="", show_default=False, err=True)
    except (EOFError, typer.Abort):
        answer = None
    if answer is None or answer.strip() != older_than.strip():
        err.print(render.text("cancelled: the duration did not match; nothing was deleted", "yellow"))
        raise typer.Exit(int(ExitCode.INTERRUPTED))


COLUMNS = (
    render.Column("what", "what", wrap=True),
    render.Column("rows", "rows", justify="right"),
)


def _render(report: op.PruneReport, page: render.Page | None, err: Console) -> None:
    """Rows per table, then what was left and why."""
    if page is None:
        return
    t = report.totals
    by_status = ", ".join(f"{status} {n:,}" for status, n in sorted(t.runs_by_status.items()))
    rows = [{"what": f"pgflow.runs ({by_status})", "rows": f"{t.runs:,}"},
            {"what": "pgflow.step_states", "rows": f"{t.step_states:,}"},
            {"what": "pgflow.step_tasks", "rows": f"{t.step_tasks:,}"},
            {"what": "pgflow.workers", "rows": f"{t.workers:,}"}]
    rows += [{"what": f"archive of queue {queue}", "rows": f"{n:,}"} for queue, n in sorted(t.archives.items())]
    verb = "would be deleted (dry run: nothing was changed)" if report.dry_run else "deleted"
    page.table(COLUMNS, rows, title=f"history before {report.cutoff:%Y-%m-%d %H:%M:%S %Z} {verb}")
    if t.skipped_locked:
        page.line(f"{t.skipped_locked:,} finished run(s) were held by another session (a late report, another prune) "
                  "and were left for the next prune", "yellow")
    if t.kept_open_tasks:
        page.line(f"{t.kept_open_tasks:,} finished run(s) still have a queued or started task and are kept: "
                  "pgflow runs show RUN_ID tells which", "yellow")
    page.line(f"{t.scanned:,} runs scanned in {t.batches:,} batches · {report.seconds:.1f} s", "dim")

"""``pgflow drop-flow SLUG``: plan, refuse or confirm, (export,) delete in one transaction, verify
(docs/drop-flow.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pgflow_cli import render
from pgflow_cli.cli import common
from pgflow_cli.cli.audit import _bytes
from pgflow_cli.cli.common import STATE, OutputFormat
from pgflow_cli.errors import ExitCode, PgflowError, UsageError
from pgflow_cli.operations import drop_flow as drop_op

DOCUMENT_KIND = "pgflow-cli/drop-flow"
DOCUMENT_VERSION = 2
"""2: ``database`` is an object (the server connected to), was a string."""

HELP = """Delete one concrete flow for good: its runs, step states and tasks, its definition, and its
private PGMQ queues with their archives, in one transaction and in the runtime's lock order.

First prints the plan (rows per table, queued and archived messages, queue tables and sizes, the
flow's workers and fences). Refuses while live workers serve the flow or runs are started, unless
the flow is fenced and drained, or --force. Asks you to type the slug; without a terminal, pass
--yes --confirm SLUG. After the deletion it checks that nothing of the flow is left.
Read docs/drop-flow.md before you run it.

Exit 0 deleted (or --dry-run); 1 refused: still active (fence and drain, or --force); 2 usage;
3 cannot connect, no migration 0008, or not allowed; 4 a lock stayed busy; 6 unknown flow (slugs are
exact: "MyFlow" is not "myflow") or queue problems; 130 confirmation declined. Nothing is deleted
unless the exit code is 0 and it was not a dry run."""


def register(app: typer.Typer) -> None:
    """Attach ``drop-flow`` to the root command."""
    app.command("drop-flow", help=HELP)(drop_flow)


def drop_flow(
    flow_slug: Annotated[str, typer.Argument(metavar="SLUG", help="The exact flow slug (letter case matters).")],
    dsn: common.DsnOption = None,
    sandbox: common.SandboxOption = False,
    connect_timeout: common.ConnectTimeoutOption = 10,
    output_format: common.FormatOption = OutputFormat.table,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and the verdict; delete nothing.")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="Delete even while live workers serve the flow or runs are started (they are abandoned). "
        "Never overrides queue problems.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask; needs --confirm SLUG too.")] = False,
    confirm: Annotated[Optional[str], typer.Option(
        "--confirm", metavar="SLUG", help="The slug again, for --yes (must match exactly).", show_default=False)] = None,
    export: Annotated[Optional[Path], typer.Option(
        "--export", metavar="DIR", help="First write the definition and run history (inputs and outputs "
        "included, message bodies not) as JSON into this new or empty directory.", show_default=False)] = None,
    lock_timeout: Annotated[float, typer.Option(
        "--lock-timeout", min=0.1, metavar="SECONDS",
        help="Seconds to wait for a lock (a worker finishing a task of the flow) before retrying.")] = 10.0,
    retries: Annotated[int, typer.Option("--retries", min=1, max=20, metavar="N",
                                         help="Transactions tried on lock timeouts and deadlocks.")] = 3,
) -> None:
    STATE.output_format = output_format
    if output_format == OutputFormat.csv:
        raise UsageError("drop-flow reports as table or json, not csv")
    if confirm is not None and confirm != flow_slug:
        raise UsageError(f"--confirm {confirm!r} does not match the flow slug {flow_slug!r}",
                         hint="give the exact slug twice; letter case matters")
    if yes and confirm is None and not dry_run:
        raise UsageError("--yes needs --confirm SLUG as well", hint=f"pgflow drop-flow {flow_slug} --yes --confirm {flow_slug}")
    interactive = not (yes and confirm == flow_slug) and not dry_run
    if interactive and not sys.stdin.isatty():
        raise UsageError("drop-flow deletes data: on no terminal, confirm with --yes --confirm SLUG",
                         hint="or run it on a terminal and type the slug when asked")
    if dry_run and export is not None:
        raise UsageError("--dry-run writes nothing, so it cannot --export",
                         hint="the export is written inside the deletion's transaction; drop one of the two options")
    export_dir = drop_op.prepare_export_dir(export) if export is not None else None

    err = render.stderr_console()
    table = output_format.human
    conn, target = common.open_connection(dsn, sandbox, connect_timeout)
    with common.mapped_errors(target), conn:
        if table:
            err.print(render.text(f"planning the deletion of flow {flow_slug!r} on {target.describe()}", "dim"))
        plan = drop_op.plan(conn, flow_slug)
        if table:
            render_plan(plan, render.stdout_console())
        problem = drop_op.refusal(plan, force=force)
        if problem is not None or dry_run:
            if output_format == OutputFormat.json:
                render.write_json(_document(target, plan, None, dry_run=dry_run))
            if problem is not None:
                raise problem
            if table:
                render.stdout_console().print(render.text(
                    "dry run: nothing was deleted" + (" (it would go ahead only with --force)"
                                                      if plan.verdict == "needs_force" else ""), "dim"))
            return
        if interactive:
            _ask(flow_slug, err)

        def on_retry(attempt: int, error: BaseException, delay: float) -> None:
            if table:
                err.print(render.text(f"attempt {attempt}: {str(error).strip().splitlines()[0]}; "
                                      f"rolled back, retrying in {delay:.1f}s", "yellow"))

        if table:
            err.print(render.text("deleting in one transaction..." + (f" (exporting to {export_dir} first)" if export_dir else "")))
        result = drop_op.drop(conn, flow_slug, force=force, export_dir=export_dir, lock_timeout=lock_timeout,
                              attempts=retries, on_retry=on_retry)

    if output_format == OutputFormat.json:
        render.write_json(_document(target, plan, result, dry_run=False))
    else:
        render_result(flow_slug, result, render.stdout_console())
    if result.leftovers:
        raise PgflowError(
            f"flow {flow_slug!r} was deleted, but the check afterwards still found: " + ", ".join(result.leftovers),
            hint="this is a bug in pgflow-cli or a writer that ignores pgflow's locks; report it with the JSON output",
        )


def _ask(flow_slug: str, err: Console) -> None:
    err.print(render.text(f"This deletes flow {flow_slug!r} with everything listed above. It cannot be undone.", "bold"))
    try:
        answer = typer.prompt("Type the flow slug to delete it", default="", show_default=False, err=True)
    except (EOFError, typer.Abort):
        answer = None
    if answer != flow_slug:
        err.print(render.text("cancelled: the slug did not match; nothing was deleted", "yellow"))
        raise typer.Exit(int(ExitCode.INTERRUPTED))


def _document(target: Any, plan: drop_op.DropPlan, result: drop_op.DropResult | None, *,
              dry_run: bool) -> dict[str, Any]:
    return common.versioned({
        "kind": DOCUMENT_KIND, "version": DOCUMENT_VERSION, "flow_slug": plan.flow_slug,
        "dry_run": dry_run, "plan": plan.to_dict(), "result": result.to_dict() if result else None,
    }, target)


# --------------------------------------------------------------------------------------------
# table rendering: every value goes through render.text()
# --------------------------------------------------------------------------------------------


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _by_status(counts: dict[str, int]) -> str:
    return ", ".join(f"{status} {n:,}" for status, n in sorted(counts.items())) or "-"


def render_plan(plan: drop_op.DropPlan, console: Console) -> None:
    """The plan: rows per table, queues, workers and fences, problems and the verdict."""
    console.print(Text.assemble(("drop-flow plan for flow ", "bold"), render.text(plan.flow_slug, "bold"),
                                render.text(f"  (queue mode {plan.queue_mode})", "dim")))
    rows = Table(show_header=True, pad_edge=False, box=None)
    rows.add_column("table")
    rows.add_column("rows deleted", justify="right")
    rows.add_column("by status")
    for name in ("flows", "steps", "deps", "runs", "step_states", "step_tasks", "workers"):
        note = _by_status(plan.by_status.get(name, {})) if name in plan.by_status else (
            "stale and stopped rows only" if name == "workers" else "")
        rows.add_row(render.text(f"pgflow.{name}"), render.text(_count(plan.rows.get(name))), render.text(note, "dim"))
    console.print(rows)

    queues = Table(show_header=True, pad_edge=False, box=None)
    for column, justify in (("queue", "left"), ("pgmq.meta", "left"), ("tables", "left"), ("queued msgs", "right"),
                            ("archived msgs", "right"), ("size", "right"), ("used by", "left")):
        queues.add_column(column, justify=justify)  # type: ignore[arg-type]
    for q in plan.queues:
        tables = "missing" if q.state == "missing" else "present"
        queues.add_row(render.text(q.queue_name, "red" if q.problems else None), render.text(q.listed_as or "-"),
                       render.text(tables, "yellow" if q.state == "missing" else None), render.text(_count(q.messages)),
                       render.text(_count(q.archived)), render.text(_bytes(q.bytes)), render.text(", ".join(q.origins)))
    console.print(queues)
    for q in plan.queues:
        if q.state == "missing":
            console.print(render.text(f"  queue {q.queue_name}: its table is already gone (dropped outside pgflow?); "
                                      "the deletion reports it and removes what is left of it", "yellow"))

    _render_workers(plan, console)
    for problem in plan.problems:
        console.print(render.text(f"  problem: {problem}", "red"))
    verdict = {"ready": ("ready: nothing works on this flow any more", "green"),
               "needs_force": ("blocked: " + "; ".join(plan.blockers), "yellow"),
               "refused": ("refused: the flow's queues are not its own alone (see the problems)", "bold red")}
    message, style = verdict.get(plan.verdict, (plan.verdict, None))
    console.print(render.text(message, style))


def _render_workers(plan: drop_op.DropPlan, console: Console) -> None:
    activity = plan.activity
    functions = activity.get("functions") or []
    fence = "fenced" if activity.get("fenced") else "not fenced"
    drained = "drained" if activity.get("drained") else f"{activity.get('in_flight_tasks', 0)} task(s) in flight"
    console.print(render.text(
        f"workers: {activity.get('live_workers', 0)} live, {activity.get('draining_workers', 0)} draining, "
        f"{activity.get('stale_workers', 0)} stale or stopped · {fence} · {drained}"))
    if functions:
        console.print(render.text("  functions: " + ", ".join(
            f"{f['function_name']} ({'enabled' if f['enabled'] else 'disabled'})" for f in functions), "dim"))
    for w in plan.workers:
        if w["state"] in ("live", "draining"):
            console.print(render.text(
                f"  {w['state']} worker {w['worker_id']} of {w['function_name']} on queue {w['queue_name']}"
                + (f" step {w['step_slug']}" if w.get("step_slug") else "")
                + f", heartbeat {w['seconds_since_heartbeat']} s ago", "yellow" if w["state"] == "live" else None))


def render_result(flow_slug: str, result: drop_op.DropResult, console: Console) -> None:
    """Per-table counts, the queues, the workers and the verification."""
    table = Table(title=Text.assemble(("deleted flow ", "bold"), render.text(flow_slug, "bold")),
                  show_header=True, pad_edge=False, box=None, title_justify="left")
    table.add_column("table")
    table.add_column("rows", justify="right")
    for name in drop_op.TABLES:
        table.add_row(render.text(f"pgflow.{name}"), render.text(_count(result.deleted[name])))
    for q in result.queues:
        what = "dropped" if q["outcome"] == "dropped" else "already gone"
        table.add_row(render.text(f"queue {q['queue_name']} ({what})"),
                      render.text(f"{_count(q['messages'])} queued, {_count(q['archived'])} archived"))
    console.print(table)
    for q in result.queues:
        if q["outcome"] == "already_gone":
            console.print(render.text(f"warning: queue {q['queue_name']} was already gone before the deletion", "yellow"))
        for note in q.get("leftovers") or []:
            console.print(render.text(f"  queue {q['queue_name']}: {note}", "dim"))
    if result.workers_told_to_stop:
        console.print(render.text(
            f"{result.workers_told_to_stop} worker row(s) of the flow were marked deprecated: those workers stop at "
            "their next heartbeat; stop their processes too", "yellow"))
    functions = sorted({f["function_name"] for f in result.activity.get("functions") or []})
    if functions:
        console.print(render.text(
            "worker functions left in place (yours to remove once nothing else uses them): " + ", ".join(functions), "dim"))
    if result.export:
        console.print(render.text(f"exported to {result.export['directory']}: " + ", ".join(
            f"{k} {v:,}" for k, v in result.export["rows"].items()), "dim"))
    if result.leftovers:
        console.print(render.text("check afterwards FAILED: " + ", ".join(result.leftovers), "bold red"))
    else:
        console.print(render.text(f"checked: nothing of flow {flow_slug!r} is left (rows, queue tables, pgmq.meta) · "
                                  f"{result.seconds:.2f} s", "green"))


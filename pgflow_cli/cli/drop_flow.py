"""``pgflow drop-flow SLUG``: plan, refuse or confirm, (export,) delete in one transaction, verify
(docs/drop-flow.md)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from pgflow_cli import render
from pgflow_cli.cli import common
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
3 cannot connect, no migration 0003, or not allowed; 4 a lock stayed busy; 6 unknown flow (slugs are
exact: "MyFlow" is not "myflow") or queue problems; 130 confirmation declined. Nothing is deleted
unless the exit code is 0 and it was not a dry run."""


def register(app: typer.Typer) -> None:
    """Attach ``drop-flow`` to the root command."""
    app.command("drop-flow", help=HELP)(common.option_groups(drop_flow))


def drop_flow(
    flow_slug: Annotated[str, typer.Argument(metavar="SLUG", help="The exact flow slug (letter case matters).")],
    where: common.TargetOptions = common.ANY_TARGET,
    output_format: common.FormatOption = OutputFormat.table,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and the verdict; delete nothing.")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="Delete even while live workers serve the flow or runs are started (they are abandoned). "
        "Never overrides queue problems.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask; needs --confirm SLUG too.")] = False,
    confirm: Annotated[str | None, typer.Option(
        "--confirm", metavar="SLUG", help="The slug again, for --yes (must match exactly).", show_default=False)] = None,
    export: Annotated[Path | None, typer.Option(
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
        raise UsageError("drop-flow reports as table, plain, markdown or json, not csv")
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
    with where.connected() as (conn, target):
        if table:
            err.print(render.text(f"planning the deletion of flow {flow_slug!r} on {target.describe()}", "dim"))
        plan = drop_op.plan(conn, flow_slug)
        page = render.Page(output_format.value) if table else None
        if page is not None:
            render_plan(plan, page)
        problem = drop_op.refusal(plan, force=force)
        if problem is not None or dry_run:
            if output_format == OutputFormat.json:
                render.write_json(_document(target, plan, None, dry_run=dry_run))
            if problem is not None:
                raise problem
            if page is not None:
                page.line("dry run: nothing was deleted" + (" (it would go ahead only with --force)"
                                                            if plan.verdict == "needs_force" else ""), "dim")
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
        render_result(flow_slug, result, page or render.Page(output_format.value))
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


PLAN_COLUMNS = (
    render.Column("table", "table"),
    render.Column("rows", "rows deleted", justify="right"),
    render.Column("by_status", "by status", drop=1, wrap=True),
)
QUEUE_COLUMNS = (
    render.Column("queue", "queue", wrap=True),
    render.Column("meta", "pgmq.meta", drop=4, wrap=True),
    render.Column("tables", "tables"),
    render.Column("messages", "queued msgs", justify="right"),
    render.Column("archived", "archived msgs", drop=3, justify="right"),
    render.Column("size", "size", drop=5, justify="right"),
    render.Column("used_by", "used by", drop=2, wrap=True),
)
"""The plan's queues; too narrow a terminal leaves out size, pgmq.meta, archived msgs, used by (in that order)."""
RESULT_COLUMNS = (
    render.Column("table", "table", wrap=True),
    render.Column("rows", "rows", wrap=True, justify="right"),
)


def _plan_style(key: str, row: Mapping[str, Any]) -> str | None:
    if key == "by_status":
        return "dim"
    if key == "queue" and row.get("problems"):
        return "red"
    if key == "tables" and row.get("tables") == "missing":
        return "yellow"
    return None


def render_plan(plan: drop_op.DropPlan, page: render.Page) -> None:
    """The plan: rows per table, queues, workers and fences, problems and the verdict.

    Args:
        plan: what :func:`pgflow_cli.operations.drop_flow.plan` found.
        page: where to write it (``table``, ``plain`` or ``markdown``).
    """
    page.line(f"drop-flow plan for flow {plan.flow_slug} (queue mode {plan.queue_mode})", "bold")
    page.table(PLAN_COLUMNS, [
        {"table": f"pgflow.{name}", "rows": _count(plan.rows.get(name)),
         "by_status": _by_status(plan.by_status.get(name, {})) if name in plan.by_status
         else "stale and stopped rows only" if name == "workers" else ""}
        for name in ("flows", "steps", "deps", "runs", "step_states", "step_tasks", "workers")], style=_plan_style)
    page.table(QUEUE_COLUMNS, [
        {"queue": q.queue_name, "problems": bool(q.problems), "meta": q.listed_as or "-",
         "tables": "missing" if q.state == "missing" else "present", "messages": _count(q.messages),
         "archived": _count(q.archived), "size": render.size(q.bytes), "used_by": ", ".join(q.origins)}
        for q in plan.queues], style=_plan_style)
    for q in plan.queues:
        if q.state == "missing":
            page.line(f"  queue {q.queue_name}: its table is already gone (dropped outside pgflow?); "
                      "the deletion reports it and removes what is left of it", "yellow")

    _render_workers(plan, page)
    for problem in plan.problems:
        page.line(f"  problem: {problem}", "red")
    verdict = {"ready": ("ready: nothing works on this flow any more", "green"),
               "needs_force": ("blocked: " + "; ".join(plan.blockers), "yellow"),
               "refused": ("refused: the flow's queues are not its own alone (see the problems)", "bold red")}
    message, style = verdict.get(plan.verdict, (plan.verdict, None))
    page.line(message, style)


def _render_workers(plan: drop_op.DropPlan, page: render.Page) -> None:
    activity = plan.activity
    functions = activity.get("functions") or []
    fence = "fenced" if activity.get("fenced") else "not fenced"
    drained = "drained" if activity.get("drained") else f"{activity.get('in_flight_tasks', 0)} task(s) in flight"
    page.line(f"workers: {activity.get('live_workers', 0)} live, {activity.get('draining_workers', 0)} draining, "
              f"{activity.get('stale_workers', 0)} stale or stopped · {fence} · {drained}")
    if functions:
        page.line("  functions: " + ", ".join(
            f"{f['function_name']} ({'enabled' if f['enabled'] else 'disabled'})" for f in functions), "dim")
    for w in plan.workers:
        if w["state"] in ("live", "draining"):
            page.line(f"  {w['state']} worker {w['worker_id']} of {w['function_name']} on queue {w['queue_name']}"
                      + (f" step {w['step_slug']}" if w.get("step_slug") else "")
                      + f", heartbeat {w['seconds_since_heartbeat']} s ago", "yellow" if w["state"] == "live" else None)


def render_result(flow_slug: str, result: drop_op.DropResult, page: render.Page) -> None:
    """Per-table counts, the queues, the workers and the verification.

    Args:
        flow_slug: the flow deleted.
        result: what :func:`pgflow_cli.operations.drop_flow.drop` did.
        page: where to write it (``table``, ``plain`` or ``markdown``).
    """
    rows: list[dict[str, str]] = [{"table": f"pgflow.{name}", "rows": _count(result.deleted[name])}
                                  for name in drop_op.TABLES]
    for q in result.queues:
        what = "dropped" if q["outcome"] == "dropped" else "already gone"
        rows.append({"table": f"queue {q['queue_name']} ({what})",
                     "rows": f"{_count(q['messages'])} queued, {_count(q['archived'])} archived"})
    page.table(RESULT_COLUMNS, rows, title=f"deleted flow {flow_slug}")
    for q in result.queues:
        if q["outcome"] == "already_gone":
            page.line(f"warning: queue {q['queue_name']} was already gone before the deletion", "yellow")
        for note in q.get("leftovers") or []:
            page.line(f"  queue {q['queue_name']}: {note}", "dim")
    if result.workers_told_to_stop:
        page.line(f"{result.workers_told_to_stop} worker row(s) of the flow were marked deprecated: those workers "
                  "stop at their next heartbeat; stop their processes too", "yellow")
    functions = sorted({f["function_name"] for f in result.activity.get("functions") or []})
    if functions:
        page.line("worker functions left in place (yours to remove once nothing else uses them): "
                  + ", ".join(functions), "dim")
    if result.export:
        page.line(f"exported to {result.export['directory']}: " + ", ".join(
            f"{k} {v:,}" for k, v in result.export["rows"].items()), "dim")
    if result.leftovers:
        page.line("check afterwards FAILED: " + ", ".join(result.leftovers), "bold red")
    else:
        page.line(f"checked: nothing of flow {flow_slug!r} is left (rows, queue tables, pgmq.meta) · "
                  f"{result.seconds:.2f} s", "green")

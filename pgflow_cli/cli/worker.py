"""``pgflow worker MODULE:FLOW``: run the reference worker for a flow from your Python module."""

from __future__ import annotations

import enum
import logging
from typing import Annotated

import typer

from pgflow_cli import db, render
from pgflow_cli.cli.common import ANY_TARGET, TargetOptions, mapped_errors, option_groups
from pgflow_cli.operations import worker as worker_op

log = logging.getLogger("pgflow.worker")

HELP = """Run the reference worker for a flow defined in your Python module.

MODULE:FLOW names a Flow, or a with_step_queues() flow, as `package.module:name` (imported with
the current directory on the path) or `path/to/file.py:name`. A plain flow's worker serves the
whole flow on its queue lower(flow_slug) and takes no --step; a step-queued flow's worker serves
exactly one step (--step, required) on that step's private queue. The module, the flow, the step
and every generated queue name are checked before the database is contacted.

Logs (stderr) name the flow, step, run, task, queue and function; never inputs, outputs or
message bodies. A failed attempt the database retries is a WARNING (attempt k/n, when it is
retried, the exception's type and message), the last one an ERROR. --log-format json writes one
JSON object per line; --log-tracebacks adds tracebacks to those lines; --store-tracebacks also
stores them with the task's error (pgflow runs show).

SIGTERM or SIGINT stops polling, lets running handlers finish (--drain-timeout), marks the
worker stopped and exits 0. A second SIGINT (Ctrl-C again) or SIGTERM stops now: async handlers
are cancelled, and the tasks still running stay started for stalled-task recovery (exit 130).

Exit 0: stopped cleanly. Exit 1: stopped after a fatal claim (unsupported work; the function is
paused, see docs/claim-protocol.md). Exit 2: bad MODULE:FLOW, --step, options or flow definition.
Exit 3: cannot connect. Exit 6: startup refused by the database: function fenced (PF001), protocol
mismatch (PF002), the flow exists with another shape or routing, or a queue collision (PF004).
Exit 130: stopped now by a second signal. Details: docs/handlers.md, docs/step-queues.md.

--metrics-port serves Prometheus metrics per route (tasks claimed, completed, failed, handler
durations, polls, report batches, database errors, heartbeat age, state) and /healthz (200 while
the worker polls, 503 otherwise); a port in use, or the metrics extra missing, exits 2.

\b
Examples:
  pgflow worker myapp.flows:scrape --concurrency 20
  pgflow worker ./flows.py:scrape_queued --step parse --sandbox
  pgflow worker ./flows.py:scrape_queued --step parse --log-format json --log-tracebacks
  pgflow worker myapp.flows:scrape --metrics-port 9464 --metrics-host 0.0.0.0"""


class LogLevel(str, enum.Enum):
    """Lowest level the worker logs."""

    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


class LogFormat(str, enum.Enum):
    """How log records are written to stderr."""

    text = "text"
    json = "json"


def register(app: typer.Typer) -> None:
    """Attach ``worker`` to the root command."""
    app.command("worker", help=HELP)(option_groups(worker))


def worker(
    target: Annotated[str, typer.Argument(metavar="MODULE:FLOW", help="Where the flow is defined, e.g. myapp.flows:scrape.",
                                          show_default=False)],
    step: Annotated[str | None, typer.Option(
        "--step", metavar="SLUG", show_default=False,
        help="The step to serve (step-queued flows only, where it is required).")] = None,
    concurrency: Annotated[int, typer.Option(
        "--concurrency", "-c", min=1, metavar="N", help="Handlers running at once (tasks in flight).")] = 10,
    function: Annotated[str | None, typer.Option(
        "--function", metavar="NAME", show_default=False,
        help="Worker function to register under (the fence acts on it). Default: <flow>-worker, "
        "or <flow>-<step>-worker for a step worker.")] = None,
    options: TargetOptions = ANY_TARGET,
    heartbeat_interval: Annotated[float, typer.Option(
        "--heartbeat-interval", min=0.1, metavar="SECONDS", help="Seconds between heartbeats.")] = 5.0,
    drain_timeout: Annotated[float, typer.Option(
        "--drain-timeout", min=0, metavar="SECONDS",
        help="On stop, seconds to wait for running handlers; tasks still running are left to stalled recovery.")] = 60.0,
    worker_version: Annotated[str, typer.Option(
        "--worker-version", envvar="PGFLOW_WORKER_VERSION", metavar="TEXT",
        help="Version this worker reports at registration, shown by `pgflow coverage` "
        "(e.g. your release tag). Env: PGFLOW_WORKER_VERSION.")] = worker_op.DEFAULT_WORKER_VERSION,
    log_level: Annotated[LogLevel, typer.Option("--log-level", case_sensitive=False, help="Lowest level logged.")]
    = LogLevel.info,
    log_format: Annotated[LogFormat, typer.Option(
        "--log-format", case_sensitive=False, help="text: one line per record; json: one JSON object per line "
        "with the record's fields (flow, step, run_id, task_index, attempt, ...).")] = LogFormat.text,
    log_tracebacks: Annotated[bool, typer.Option(
        "--log-tracebacks", help="Failed attempts are logged with the handler's traceback.")] = False,
    store_tracebacks: Annotated[bool, typer.Option(
        "--store-tracebacks", help="The task's stored error carries the handler's traceback after the message "
        "(shortened to its innermost frames; shown by `pgflow runs show`).")] = False,
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", min=0, max=65535, metavar="PORT", show_default=False,
        help="Serve Prometheus metrics on /metrics and a health check on /healthz at this port (0: any free port, "
        "logged at start). Needs the metrics extra: pip install 'pgflow-cli[metrics]'. docs/observability.md.")] = None,
    metrics_host: Annotated[str, typer.Option(
        "--metrics-host", metavar="ADDR", help="Address the metrics server listens on (0.0.0.0: every interface, "
        "for a scraper on another machine).")] = "127.0.0.1",
) -> None:
    worker_op.configure_logging(log_level.value, log_format.value)
    plan = worker_op.plan_worker(target, step_slug=step, function_name=function)
    where = options.resolve()
    with db.connect(where, connect_timeout=options.connect_timeout) as conn, mapped_errors(where):  # exit 3 first
        recompile = worker_op.local_recompile(conn, plan)
    if recompile is not None:  # local mode: say what the worker's compilation deletes before it does
        render.stderr_console().print(render.text(recompile.warning(), "bold red"))
        for difference in recompile.differences:
            render.stderr_console().print(render.text(f"  {difference}", "red"))
    runner = worker_op.build_worker(plan, where.conninfo, worker_op.WorkerOptions(
        max_concurrent=concurrency, batch_size=min(concurrency, 10), connect_timeout=options.connect_timeout,
        heartbeat_interval=heartbeat_interval, drain_timeout=drain_timeout, worker_version=worker_version,
        application_name=f"pgflow-worker {plan.function_name}"[:63], log_tracebacks=log_tracebacks,
        store_tracebacks=store_tracebacks, metrics_port=metrics_port, metrics_host=metrics_host,
    ))
    log.info("pgflow worker %s: flow=%s step=%s queue=%s mode=%s function=%s concurrency=%d version=%s database=%s",
             runner.worker_id, plan.flow.slug, plan.step_slug or "-", plan.queue_name, plan.queue_mode,
             plan.function_name, concurrency, render.display(worker_version), where.describe())
    with mapped_errors(where):
        code = runner.run()
    if code:
        raise typer.Exit(code)

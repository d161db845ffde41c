"""``pgflow sandbox``: a private local PostgreSQL with real PGMQ and the pgflow schema."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from pgflow_cli import render
from pgflow_cli.cli.state import STATE, FormatOption, OutputFormat
from pgflow_cli.errors import DeadlineReached, ExitCode, UsageError

if TYPE_CHECKING:  # imported where used: `pgflow sandbox dsn` needs neither psycopg nor rich
    from rich.console import Console

    from pgflow_cli.sandbox import Sandbox

app = typer.Typer(
    help="A private local PostgreSQL (Unix socket only) with real PGMQ and the pgflow schema, so every "
    "command runs without a database of your own. Every database command accepts --sandbox to target it.\n\n"
    "Directory: $PGFLOW_SANDBOX_DIR, else /var/lib/pgflow-cli/sandbox as root, else ~/.cache/pgflow-cli/sandbox.",
    no_args_is_help=True,
)


def register(root: typer.Typer) -> None:
    """Attach the ``sandbox`` group to the root command."""
    root.add_typer(app, name="sandbox")


SeedOption = Annotated[
    str | None,
    typer.Option(
        "--seed",
        help="Load sample data. 'demo': the pre-upgrade baseline schema with flows (some with names the "
        "queue-identity rules reject) and runs in several states.",
        metavar="NAME",
    ),
]


def _sandbox() -> Sandbox:
    """The sandbox of the default directory (:func:`pgflow_cli.sandbox.default_dir`)."""
    from pgflow_cli.sandbox import Sandbox

    return Sandbox.default()


def _err() -> Console:
    return render.stderr_console()


def _seed(conninfo: str, seed: str) -> None:
    from pgflow_cli.sandbox import seeds

    seeds.load(conninfo, seed, progress=lambda message: _err().print(render.text(message, "dim")))


ResetOption = Annotated[
    bool,
    typer.Option("--reset", help="Throw the existing sandbox database away first (as `pgflow sandbox reset --yes`), "
                 "so that --seed loads its data again."),
]


@app.command()
def up(
    seed: SeedOption = None,
    reset: ResetOption = False,
    output_format: FormatOption = OutputFormat.table,
) -> None:
    """Create (first time) or start the sandbox. A new database gets the current schema.

    With --seed demo a new database gets the pre-upgrade baseline and sample data, so that `pgflow audit
    --sandbox` and `pgflow migrate plan --sandbox` have something to report. An existing sandbox database is
    only started, never migrated nor seeded: its data is kept (the output says so); --reset throws it away
    first. Upgrade it with `pgflow migrate apply --sandbox`, as you would a real one.

    \b
    Examples:
      pgflow sandbox up
      pgflow sandbox up --seed demo
      pgflow sandbox up --seed demo --reset
    """
    from pgflow_cli.sandbox import seeds

    STATE.output_format = output_format
    sandbox = _sandbox()
    if seed is not None:
        seeds.check_name(seed)
    _err().print(render.text(f"sandbox directory: {sandbox.directory}", "dim"))
    if reset and sandbox.server.exists():
        sandbox.reset()
        _err().print(render.text("dropped the existing sandbox database (--reset)", "dim"))
    kept: str | None = None
    if seed is not None:
        seeded: list[str] = []

        def prepare(conninfo: str) -> None:  # a new database: seeded before it is published
            _seed(conninfo, seed)
            seeded.append(conninfo)

        applied = sandbox.up(target=seeds.schema_target(seed), prepare=prepare)
        if not seeded:  # an existing database: keep what it holds, say so
            kept = (f"kept the existing sandbox data; seed {seed!r} not loaded "
                    f"(to load it again: pgflow sandbox up --seed {seed} --reset)")
    else:
        applied = sandbox.up()
    for item in applied:
        _err().print(render.text(f"applied {item.migration.label} ({item.duration_ms} ms)", "dim"))
    _show(sandbox, output_format, headline="sandbox is up", seed={"name": seed, "loaded": kept is None,
                                                                    "note": kept} if seed else None)


@app.command()
def worker(
    flow: Annotated[
        list[str] | None,
        typer.Option("--flow", metavar="SLUG", help="Demo flow to serve (repeatable); default: every runnable demo flow "
                     "(greetUser, processOrder; billing too after the upgrade)."),
    ] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, max=64, metavar="N", help="Handlers in flight per flow.")] = 4,
    seconds: Annotated[
        float | None,
        typer.Option("--seconds", min=0.5, metavar="SECONDS", help="Stop after this many seconds (default: run until Ctrl-C)."),
    ] = None,
    until_idle: Annotated[bool, typer.Option(
        "--until-idle", help="Stop once no run of the served flows is in flight; with --seconds as a deadline "
        "(exit 5 when runs are left).")] = False,
) -> None:
    """Run the demo workers (reference Python worker) against the sandbox until Ctrl-C.

    They finish the seeded in-flight runs. The sandbox has no pg_cron, so this command also calls
    pgflow.requeue_stalled_tasks() every 15 s (every 0.5 s with --seconds or --until-idle), as the cron
    job does in production: the demo's task claimed by a vanished worker comes back 60 s after its
    claim (step timeout 30 s + 30 s). Ctrl-C drains in-flight tasks before exiting.

    \b
    Examples:
      pgflow sandbox worker
      pgflow sandbox worker --until-idle --seconds 60
    """
    import logging

    from pgflow_cli.sandbox import demo

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    conninfo = _sandbox().running_conninfo()
    unknown = [slug for slug in flow or [] if slug not in demo.RUNNABLE_AFTER_UPGRADE]
    if unknown:
        raise UsageError(f"not a runnable demo flow: {', '.join(unknown)}",
                         hint="choose from: " + ", ".join(demo.RUNNABLE_AFTER_UPGRADE) + " (billing after the upgrade)")
    left = demo.run_workers(conninfo, flow, max_concurrent=concurrency, stop_after=seconds, until_idle=until_idle)
    if until_idle and left and seconds is not None:  # the deadline came first (Ctrl-C is a normal stop)
        raise DeadlineReached(f"{left} demo run(s) still in flight after {seconds:g} s",
                              hint="run it again, or watch them with `pgflow status --sandbox`")
    if until_idle and not left:
        _err().print("no demo run left in flight")


@app.command()
def status(output_format: FormatOption = OutputFormat.table) -> None:
    """Show whether the sandbox runs, where, and what its database holds.

    \b
    Examples:
      pgflow sandbox status
      pgflow sandbox status --format json
    """
    STATE.output_format = output_format
    _show(_sandbox(), output_format, headline=None)


@app.command()
def dsn() -> None:
    """Print the sandbox connection string (Unix socket; no password needed), e.g. for psql.

    \b
    Examples:
      pgflow sandbox dsn
    """
    from pgflow_cli.sandbox import LocalServer, default_dir, validate_base_dir
    from pgflow_cli.sandbox.location import running_conninfo

    directory = validate_base_dir(default_dir())
    typer.echo(running_conninfo(LocalServer(directory), directory))


@app.command()
def down() -> None:
    """Stop the sandbox server; its data stays for the next `up`.

    \b
    Examples:
      pgflow sandbox down
    """
    sandbox = _sandbox()
    was_running = sandbox.down()
    _err().print("sandbox stopped" if was_running else "sandbox was not running")


@app.command()
def reset(
    seed: SeedOption = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    destroy: Annotated[
        bool, typer.Option("--destroy", help="Delete the whole sandbox directory instead of recreating the database.")
    ] = False,
    output_format: FormatOption = OutputFormat.table,
) -> None:
    """Throw the sandbox database away and create it again (optionally seeded). Only the sandbox is touched.

    \b
    Examples:
      pgflow sandbox reset --yes
      pgflow sandbox reset --yes --seed demo
      pgflow sandbox reset --destroy --yes
    """
    STATE.output_format = output_format
    sandbox = _sandbox()
    if not yes:
        if not sys.stdin.isatty():
            raise UsageError("reset deletes the sandbox database; confirm with --yes when not on a terminal")
        if not typer.confirm(f"Delete the sandbox database in {sandbox.directory}?", err=True):
            _err().print("cancelled; nothing changed")
            raise typer.Exit(int(ExitCode.INTERRUPTED))
    if destroy:
        sandbox.destroy()
        _err().print(f"deleted {sandbox.directory}")
        if seed is None:
            return
        sandbox = _sandbox()
    else:
        sandbox.reset()
    up(seed=seed, output_format=output_format)


def _show(sandbox: Sandbox, output_format: OutputFormat, headline: str | None,
          seed: dict[str, object] | None = None) -> None:
    info = sandbox.status()
    if output_format == OutputFormat.json:
        render.write_json({"kind": "pgflow-cli/sandbox-status", "version": 1, **info.to_dict(),
                           **({"seed": seed} if seed else {})})
        return
    if output_format == OutputFormat.csv:
        data = info.to_dict()
        render.write_csv(list(data), [data])
        return
    console = render.stdout_console()
    if headline:
        console.print(render.text(headline, "bold green"))
    if seed and seed["note"]:
        console.print(render.text(seed["note"], "bold yellow"), soft_wrap=True)
    rows = [
        ("directory", info.directory),
        ("running", "yes" if info.running else "no"),
        ("port", info.port),
        ("connection", info.conninfo or "(not running)"),
        ("schema version", f"{info.schema_version:04d}" if info.schema_version else None),
        ("pending migrations", info.pending_migrations),
        ("PGMQ", info.pgmq_version),
        ("flows", info.flows),
        ("runs in flight", info.runs_in_flight),
        ("mode", None if info.local_mode is None else "local (pgflow.environment=local: a changed flow is "
         "recompiled, its runs deleted)" if info.local_mode else "production (a changed flow is refused)"),
    ]
    for key, value in rows:
        # soft_wrap: a connection string must stay on one line to be copied
        console.print(render.text(f"{key:>20}: {render.display(value) if value is not None else '-'}"), soft_wrap=True)
    if info.running:
        console.print(render.text("next: pgflow audit --sandbox", "dim"))
    else:
        console.print(render.text("start it with: pgflow sandbox up", "dim"))

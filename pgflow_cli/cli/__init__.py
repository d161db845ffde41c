"""The ``pgflow`` command line: parse options, call operations, render, map errors to exit codes.

:func:`main` is the console-script entry point. It is the only place where exceptions
become messages and exit codes (docs/exit-codes.md): a :class:`PgflowError` prints its
message, hint and detail on stderr; a psycopg error is first mapped by
:func:`pgflow_cli.db.map_database_error` (the one mapping, which commands holding a connection
use through :func:`pgflow_cli.cli.common.mapped_errors`, with their target for redaction);
anything else is a bug (exit 70) and shows a traceback only with ``--debug``.

The commands are in :data:`COMMANDS` and imported only when used (:mod:`pgflow_cli.cli.lazy`):
this module imports neither psycopg nor rich, until an error is to be reported.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Annotated, Any

import typer

from pgflow_cli import __version__
from pgflow_cli.cli.lazy import LazyCommand, LazyGroup
from pgflow_cli.cli.state import STATE, OutputFormat
from pgflow_cli.errors import ExitCode, PgflowError, UsageError, exit_code_table

COMMANDS = (
    LazyCommand("audit", "pgflow_cli.cli.audit",
                "Read-only pre-upgrade report: every flow and step name the queue-identity release rejects (with every "
                "reason), case-only conflicts, PGMQ queue hazards, and the data at stake per flow.",
                section="upgrade"),
    LazyCommand("migrate", "pgflow_cli.cli.migrate",
                "Apply pgflow's SQL migrations in order, each in one transaction recorded with its checksum in "
                "pgflow.schema_migrations.", section="upgrade"),
    LazyCommand("coverage", "pgflow_cli.cli.coverage",
                "Persisted routes versus live workers: for every route (a plain flow's queue, or each step's private "
                "queue) the live workers and the versions they reported, deprecated workers still draining, killed "
                "workers (stale), fenced functions, and the queue's backlog and oldest message.", section="deploy"),
    LazyCommand("fence", "pgflow_cli.cli.fence",
                "The rollout fence on worker functions: disable them (their workers refuse to register, the HTTP starter "
                "skips them), drain what their workers still run, and later restore exactly the recorded values.",
                section="deploy"),
    LazyCommand("drop-flow", "pgflow_cli.cli.drop_flow",
                "Delete one concrete flow for good: its runs, step states and tasks, its definition, and its private "
                "PGMQ queues with their archives, in one transaction and in the runtime's lock order.",
                section="deploy"),
    LazyCommand("prune", "pgflow_cli.cli.prune",
                "Delete history older than DURATION, in short batches: finished runs (completed or failed before the "
                "cutoff) with their step states and tasks, worker rows without a heartbeat since the cutoff and without "
                "a task in flight, and the PGMQ archive rows of pgflow's queues archived before it.", section="deploy"),
    LazyCommand("worker", "pgflow_cli.cli.worker", "Run the reference worker for a flow defined in your Python module.",
                section="run"),
    LazyCommand("task", "pgflow_cli.cli.task",
                "Manual tasks: the tasks of queue-less steps (Flow.step(..., manual=True)) that trusted code completes "
                "or fails instead of a worker (pgflow.complete_manual_task / pgflow.fail_manual_task).", section="run"),
    LazyCommand("runs", "pgflow_cli.cli.runs", "Runs and what happened in them; start a run and await its end; "
                "cancel a run, retry or resume a failed one.", section="run"),
    LazyCommand("status", "pgflow_cli.cli.status",
                "What runs, per flow, in one read-only snapshot: runs by state, tasks by state, the oldest queued task "
                "and how long it has waited, stalled tasks (what the next pgflow.requeue_stalled_tasks() call would take "
                "back, and tasks it gave up on), each queue's backlog (what pgmq.metrics() reports, counted from the "
                "queue's own table; plain flow queues and private step queues) and the workers (live, deprecated, "
                "stale).", section="inspect"),
    LazyCommand("workers", "pgflow_cli.cli.workers",
                "Worker rows (pgflow.workers): which worker serves which route, its heartbeat and its tasks in "
                "flight; and deleting the rows of workers that died without saying so.", section="inspect"),
    LazyCommand("exporter", "pgflow_cli.cli.exporter",
                "Serve the database's state as Prometheus metrics, for dashboards and alerts.", section="inspect"),
    LazyCommand("sandbox", "pgflow_cli.cli.sandbox",
                "A private local PostgreSQL (Unix socket only) with real PGMQ and the pgflow schema, so every command "
                "runs without a database of your own.", section="develop"),
)
"""Every command of ``pgflow``, in the order ``pgflow --help`` lists them: name, the module whose
``register(app)`` attaches it (imported only when the command is used, :mod:`pgflow_cli.cli.lazy`),
the first sentence of its help text (tests/output/test_lazy_commands.py checks it) and the section of
the help it is listed in (:data:`SECTIONS`). A new command is one entry here."""

SECTIONS = (
    ("upgrade", "Upgrade (before and while changing the schema)"),
    ("deploy", "Deploy (rolling out and retiring workers and flows)"),
    ("run", "Run (workers, runs, manual tasks)"),
    ("inspect", "Inspect (what runs, read-only)"),
    ("develop", "Develop (a local database to try everything)"),
)
"""The sections of ``pgflow --help``: the commands by when an operator reaches for them."""


class _Commands(LazyGroup):
    lazy_commands = COMMANDS
    sections = SECTIONS


EXIT_CODES_HELP = "\b\nExit codes (every command; docs/exit-codes.md):\n" + exit_code_table()

app = typer.Typer(
    name="pgflow",
    help="Operator tooling for pgflow on PostgreSQL + PGMQ: audit before upgrading, migrate to upgrade, "
    "gate deployments on coverage, fence and drain workers, see what runs, and a local sandbox to try it all.\n\n"
    "Typical upgrade: `pgflow audit` -> `pgflow migrate plan` -> `pgflow migrate apply`. Every command "
    "has --help with examples.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=True,  # pgflow --install-completion [SHELL] / --show-completion [SHELL] (README)
    rich_markup_mode=None,
    cls=_Commands,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pgflow-cli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for internal errors.")] = False,
    version: Annotated[  # a plain bool: typer coerces any other annotation through pydantic, which costs
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    STATE.debug = STATE.debug or debug


def report_error(error: PgflowError) -> None:
    """Print an error on stderr: JSON when ``--format json`` was chosen, else readable text.

    Commands named in the hint and detail repeat the target option the user gave
    (:func:`pgflow_cli.cli.common.with_target`), so they work when pasted.

    Args:
        error: what to report (its message, hint and detail never hold a password).
    """
    from pgflow_cli import render
    from pgflow_cli.cli.common import with_target

    hint = with_target(error.hint) if error.hint else error.hint
    detail = [with_target(line) for line in error.detail]
    if STATE.output_format == OutputFormat.json:
        document = {**error.to_dict(), "hint": hint, "detail": detail}
        sys.stderr.write(render.to_json(document, ensure_ascii=render.ascii_only(sys.stderr)) + "\n")
        return
    console = render.stderr_console()
    console.print(render.text(f"error: {error.message}", "bold red"))
    for line in detail:
        console.print(render.text(f"  {line}"))
    if hint:
        console.print(render.text(f"hint: {hint}", "yellow"))


def _lift_debug(args: list[str]) -> list[str]:
    """Accept ``--debug`` anywhere before ``--`` (also after the subcommand): sets the flag and
    removes it from what click parses."""
    if "--debug" not in args:
        return args
    end = args.index("--") if "--" in args else len(args)
    if "--debug" in args[:end]:
        STATE.debug = True
    return [a for i, a in enumerate(args) if not (a == "--debug" and i < end)]


def _ascii_safe_streams() -> None:
    """On a stdout/stderr that cannot encode Unicode, characters it cannot encode become ``\\xNN``
    escapes instead of a UnicodeEncodeError (render.display already gives ASCII punctuation).

    A UTF-8 stream (the usual case) is left as it is without importing :mod:`pgflow_cli.render`
    (rich); any other encoding is judged by :func:`pgflow_cli.render.ascii_only`.
    """
    for stream in (sys.stdout, sys.stderr):
        if (getattr(stream, "encoding", None) or "utf-8").lower() in ("utf-8", "utf8"):
            continue
        from pgflow_cli import render

        if render.ascii_only(stream) and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def _undecodable_argument(exc: Exception, args: list[str]) -> PgflowError | None:
    """A usage error (exit 2) for a failure to encode an argument that was not UTF-8 on the command
    line (Python keeps such bytes as lone surrogates, which no UTF-8 encoder accepts), naming the option
    that carried it; None when ``exc`` is anything else. The encoder fails before a byte is sent."""
    if not (isinstance(exc, UnicodeEncodeError) and "surrogates" in exc.reason):
        return None
    for position, arg in enumerate(args):
        if any("\ud800" <= char <= "\udfff" for char in arg):
            option = args[position - 1] if position and args[position - 1].startswith("-") else f"argument {position + 1}"
            return UsageError(f"{option} holds bytes that are not UTF-8; PostgreSQL cannot store them",
                              hint="pass the text in UTF-8 (check the terminal's locale)")
    return None


def _reported(exc: Exception, args: list[str] | None = None) -> int:
    """Report what a command raised and return the exit code: a :class:`PgflowError` as it is, a
    psycopg error as :func:`pgflow_cli.db.map_database_error` maps it (what
    :func:`pgflow_cli.cli.common.mapped_errors` does), an argument ``args`` held in bytes that are not
    UTF-8 as a usage error, anything else as a bug (exit 70; its traceback with ``--debug``)."""
    import psycopg

    from pgflow_cli import db

    exc = _undecodable_argument(exc, args or []) or exc
    if isinstance(exc, psycopg.Error):
        exc = db.map_database_error(exc, target=None)
    if isinstance(exc, PgflowError):
        report_error(exc)
        return int(exc.exit_code)
    if STATE.debug:  # a bug: say so plainly
        traceback.print_exception(exc)
    report_error(
        PgflowError(
            f"internal error: {type(exc).__name__}: {exc}",
            hint="this is a bug in pgflow-cli; rerun with --debug and report the traceback",
        )
    )
    return int(ExitCode.INTERNAL)


CLOSED_STDOUT_EXIT = 128 + 13
"""The exit status of a process that SIGPIPE ended (128 + 13), which a shell also reports for one that
wrote to a closed pipe (`pgflow coverage | head -1`): never a documented code (docs/exit-codes.md)."""


class StdoutClosed(BaseException):
    """Stdout's reader went away (EPIPE). A BaseException, so no ``except Exception`` of a command or
    of click turns it into another exit code; transactions in progress roll back as it passes."""


class _ClosedPipeGuard:
    """Stdout as it was, except that a write or flush meeting a closed pipe raises :class:`StdoutClosed`."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, data: str) -> int:
        try:
            return int(self._stream.write(data))
        except BrokenPipeError:
            raise StdoutClosed() from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise StdoutClosed() from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _silence_stdout() -> None:
    """Point file descriptor 1 at /dev/null, so the interpreter's last flush meets no closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ else 1)
        os.close(devnull)
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> None:
    """Run the CLI and exit with the documented exit code.

    Option parsing errors are reported by typer itself (exit 2); everything a command
    raises is reported here. Stdout closed by its reader ends the command silently with
    :data:`CLOSED_STDOUT_EXIT`, as SIGPIPE ends other programs.
    """
    command = typer.main.get_command(app)
    _ascii_safe_streams()
    stdout, sys.stdout = sys.stdout, _ClosedPipeGuard(sys.stdout)
    args = _lift_debug(list(sys.argv[1:] if argv is None else argv))
    try:
        try:
            command.main(args=args, prog_name="pgflow", standalone_mode=True)
            code: int = ExitCode.OK
        except SystemExit as exc:  # typer/click finished: --help, a usage error, typer.Exit(n)
            code = exc.code if isinstance(exc.code, int) else (ExitCode.OK if exc.code is None else ExitCode.USAGE)
        except KeyboardInterrupt:
            from pgflow_cli import render

            render.stderr_console().print("interrupted")
            code = ExitCode.INTERRUPTED
        except Exception as exc:
            code = _reported(exc, args)
        sys.stdout.flush()
    except StdoutClosed:
        _silence_stdout()
        code = CLOSED_STDOUT_EXIT
    finally:
        if isinstance(sys.stdout, _ClosedPipeGuard):
            sys.stdout = stdout
    sys.exit(int(code))

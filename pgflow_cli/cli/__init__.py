"""The ``pgflow`` command line: parse options, call operations, render, map errors to exit codes.

:func:`main` is the console-script entry point. It is the only place where exceptions
become messages and exit codes (docs/exit-codes.md): a :class:`PgflowError` prints its
message, hint and detail on stderr; a psycopg error is first mapped by
:func:`pgflow_cli.cli.common.mapped_errors` (the one mapping, which commands holding a
connection also use, with their target for redaction); anything else is a bug (exit 70) and
shows a traceback only with ``--debug``.
"""

from __future__ import annotations

import sys
import traceback
from typing import Annotated

import typer

from pgflow_cli import __version__, render
from pgflow_cli.cli.common import STATE, OutputFormat, mapped_errors, with_target
from pgflow_cli.errors import ExitCode, PgflowError, exit_code_table

EXIT_CODES_HELP = "\b\nExit codes (every command; docs/exit-codes.md):\n" + exit_code_table()

app = typer.Typer(
    name="pgflow",
    help="Operator tooling for pgflow on PostgreSQL + PGMQ: audit before upgrading, migrate to upgrade, "
    "and a local sandbox to try it all.\n\n"
    "Typical upgrade: `pgflow audit` -> `pgflow migrate plan` -> `pgflow migrate apply`.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=True,  # pgflow --install-completion [SHELL] / --show-completion [SHELL] (README)
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pgflow-cli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for internal errors.")] = False,
    version: Annotated[
        bool | None, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = None,
) -> None:
    STATE.debug = STATE.debug or debug


def _register() -> None:
    from pgflow_cli.cli import audit as audit_cli
    from pgflow_cli.cli import drop_flow as drop_flow_cli
    from pgflow_cli.cli import fence as fence_cli
    from pgflow_cli.cli import migrate as migrate_cli
    from pgflow_cli.cli import sandbox as sandbox_cli
    from pgflow_cli.cli import task as task_cli

    app.add_typer(sandbox_cli.app, name="sandbox")
    audit_cli.register(app)
    migrate_cli.register(app)
    drop_flow_cli.register(app)
    fence_cli.register(app)
    task_cli.register(app)
    from pgflow_cli.cli import coverage as coverage_cli
    from pgflow_cli.cli import worker as worker_cli

    worker_cli.register(app)
    coverage_cli.register(app)
    from pgflow_cli.cli import runs as runs_cli
    from pgflow_cli.cli import status as status_cli

    status_cli.register(app)
    runs_cli.register(app)


_register()


def report_error(error: PgflowError) -> None:
    """Print an error on stderr: JSON when ``--format json`` was chosen, else readable text.

    Commands named in the hint and detail repeat the target option the user gave
    (:func:`pgflow_cli.cli.common.with_target`), so they work when pasted.
    """
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
    escapes instead of a UnicodeEncodeError (render.display already gives ASCII punctuation)."""
    for stream in (sys.stdout, sys.stderr):
        if render.ascii_only(stream) and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def main(argv: list[str] | None = None) -> None:
    """Run the CLI and exit with the documented exit code.

    Option parsing errors are reported by typer itself (exit 2); everything a command
    raises is reported here.
    """
    command = typer.main.get_command(app)
    _ascii_safe_streams()
    args = _lift_debug(list(sys.argv[1:] if argv is None else argv))
    try:
        with mapped_errors():
            command.main(args=args, prog_name="pgflow", standalone_mode=True)
        code: int = ExitCode.OK
    except SystemExit as exc:  # typer/click finished: --help, a usage error, typer.Exit(n)
        code = exc.code if isinstance(exc.code, int) else (ExitCode.OK if exc.code is None else ExitCode.USAGE)
    except KeyboardInterrupt:
        render.stderr_console().print("interrupted")
        code = ExitCode.INTERRUPTED
    except PgflowError as exc:
        report_error(exc)
        code = exc.exit_code
    except Exception as exc:  # a bug: say so plainly
        if STATE.debug:
            traceback.print_exc()
        report_error(
            PgflowError(
                f"internal error: {type(exc).__name__}: {exc}",
                hint="this is a bug in pgflow-cli; rerun with --debug and report the traceback",
            )
        )
        code = ExitCode.INTERNAL
    sys.exit(int(code))

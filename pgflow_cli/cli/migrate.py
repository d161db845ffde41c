"""``pgflow migrate``: status, plan and apply of the shipped SQL migrations."""

from __future__ import annotations

import enum
from typing import Annotated, Any, Optional

import typer

from pgflow_cli import installer, render
from pgflow_cli.cli.common import (
    STATE,
    ConnectTimeoutOption,
    DsnOption,
    FormatOption,
    OutputFormat,
    SandboxOption,
    open_connection,
)
from pgflow_cli.errors import PgflowError, Refused, UsageError
from pgflow_cli.operations import migrate as migrate_op
from pgflow_cli.operations import upstream

app = typer.Typer(
    help="Apply pgflow's SQL migrations in order, each in one transaction recorded with its checksum in "
    "pgflow.schema_migrations.\n\n"
    "Run `pgflow audit` first, then `migrate plan`, then `migrate apply` (try `--dry-run`). Workers must be "
    "fenced and drained first for upgrades that change the worker protocol (docs/upgrade.md).",
    no_args_is_help=True,
)


class OnlineMode(str, enum.Enum):
    """Choice of path for phased migrations."""

    auto = "auto"
    always = "always"
    never = "never"


def register(root: typer.Typer) -> None:
    """Attach ``migrate`` to the root command."""
    root.add_typer(app, name="migrate")


def _summary(migration: installer.Migration) -> str:
    """The header sentence of a migration file (its first comment paragraph, up to the first period
    at the end of a line), without the '-- NNNN ' prefix."""
    parts: list[str] = []
    for line in migration.sql.splitlines():
        if not line.startswith("--") or line.startswith("--@"):
            break
        text = line[2:].strip()
        if not text:
            break
        parts.append(text)
        if text.endswith("."):
            break
    summary = " ".join(parts)
    prefix = f"{migration.version:04d} "
    summary = summary[len(prefix):] if summary.startswith(prefix) else summary
    return summary or migration.name.replace("_", " ")


def _status_rows(plan: installer.Plan) -> list[dict[str, Any]]:
    by_version = {m.version: m for m in installer.available_migrations()}
    rows = []
    for s in plan.statuses:
        row: dict[str, Any] = {
            "version": s.version,
            "name": s.name,
            "state": s.state,
            "summary": _summary(by_version[s.version]) if s.version in by_version else "",
            "applied_at": s.recorded.applied_at if s.recorded else None,
            "applied_by": s.recorded.applied_by if s.recorded else None,
            "tool_version": s.recorded.tool_version if s.recorded else None,
            "duration_ms": s.recorded.duration_ms if s.recorded else None,
            "checksum": s.file_checksum or (s.recorded.checksum if s.recorded else None),
        }
        rows.append(row)
    return rows


AssumeReleaseOption = Annotated[
    Optional[str],
    typer.Option("--assume-release", metavar="X.Y.Z",
                 help="Treat an unrecognised pgflow schema as this published release and adopt it anyway; the "
                 "assertion and every difference are recorded (docs/upgrade.md).")
]


def _conflict(the_plan: installer.Plan, found: upstream.UpstreamPlan) -> PgflowError | None:
    """What stops `apply` here: an unrecognised upstream schema, else the ledger's conflicts; a
    recognised upstream schema (or one whose release is asserted) is adopted instead."""
    return migrate_op.blocking_conflict(the_plan, found)


def _after_adoption(the_plan: installer.Plan, found: upstream.UpstreamPlan) -> list[installer.Migration]:
    """The pending migrations `apply` runs itself (the adoption reaches the baseline)."""
    upstream_schema = found.recognition.status in ("upstream", "unrecognised")
    return [m for m in the_plan.pending if not (upstream_schema and m.version <= installer.BASELINE_VERSION)]


def _print_upstream(found: upstream.UpstreamPlan) -> None:
    console = render.stdout_console()
    recognition = found.recognition
    if recognition.status in ("none", "pgflow-cli") and not found.completion:
        return
    summary = recognition.summary()
    console.print(render.text(summary if summary.startswith("unrecognised") else f"pgflow schema: {summary}",
                              "bold red" if recognition.status == "unrecognised" else None))
    for difference in recognition.differences:
        console.print(render.text(f"  {difference.describe()}", "red" if not recognition.adoptable else "dim"))
    for step in found.steps:
        console.print(render.text(f"step: {step}"))
    for item in found.must_do:
        console.print(render.text(f"  must: {item}", "yellow"))
    for note in found.notes:
        console.print(render.text(f"  note: {note}", "dim"))


STATUS_COLUMNS = ["version", "name", "state", "applied_at", "applied_by", "tool_version", "duration_ms", "summary"]


@app.command()
def status(
    dsn: DsnOption = None,
    sandbox: SandboxOption = False,
    connect_timeout: ConnectTimeoutOption = 10,
    output_format: FormatOption = OutputFormat.table,
) -> None:
    """Show applied, pending, in-progress, changed (checksum mismatch) and unknown migrations, function-file
    drift, invalid indexes, and which pgflow release installed a schema pgflow-cli did not (or adopted). Read-only.

    Exit 0 up to date or only pending; 1 a migration in progress (resume or abort it), function files whose
    installed text differs, or an invalid index; 6 when this tool cannot migrate the database (changed files,
    a newer database, a pgflow schema that matches no published release).
    """
    STATE.output_format = output_format
    conn, target = open_connection(dsn, sandbox, connect_timeout)
    with conn:
        report = migrate_op.status(conn)
    plan = report.plan
    rows = _status_rows(plan)
    if output_format == OutputFormat.json:
        render.write_json({
            "kind": "pgflow-cli/migrate-status", "version": 1, "database": target.describe(),
            "pgmq_version": plan.state.pgmq_version, "migrations": rows, **report.to_dict(),
        })
    elif output_format == OutputFormat.csv:
        render.write_csv(STATUS_COLUMNS, rows)
    else:
        _print_status(rows, target.describe(), report)
        if report.found is not None:
            _print_upstream(report.found)
    if report.conflict:
        from pgflow_cli.cli import report_error

        report_error(report.conflict)
    if report.exit_code:
        raise typer.Exit(int(report.exit_code))


def _print_status(rows: list[dict[str, Any]], where: str, report: migrate_op.StatusReport) -> None:
    from rich.table import Table

    console = render.stdout_console()
    table = Table(title=f"migrations in {render.display(where)}", title_justify="left")
    for column in ("version", "state", "applied", "by", "tool", "ms", "summary"):
        table.add_column(column, no_wrap=column != "summary", overflow="fold")
    styles = {"applied": "green", "pending": "yellow", "in_progress": "bold yellow", "changed": "bold red",
              "unknown": "bold red"}
    for row in rows:
        table.add_row(
            render.text(f"{row['version']:04d}_{row['name']}"),
            render.text(row["state"], styles.get(row["state"])),
            render.text(row["applied_at"].strftime("%Y-%m-%d %H:%M:%S") if row["applied_at"] else ""),
            render.text(row["applied_by"]),
            render.text(row["tool_version"]),
            render.text(row["duration_ms"]),
            render.text(row["summary"]),
        )
    console.print(table)
    if report.plan.files:
        files = Table(title="function files", title_justify="left")
        for column in ("file", "state", "recorded by"):
            files.add_column(column, no_wrap=True)
        for f in report.plan.files:
            style = "green" if f.state == "current" else "bold red" if f in report.plan.file_drift else "yellow"
            files.add_row(render.text(f"sql/{f.path}"),
                          render.text(f.state, style),
                          render.text(f"{f.recorded_version:04d}" if f.recorded_version else ""))
        console.print(files)
    console.print(render.text(f"PGMQ: {report.plan.state.pgmq_version or 'not installed'}"))
    style = {"up_to_date": "green", "pending": "yellow"}.get(report.verdict, "bold red")
    for line in report.lines():
        console.print(render.text(line, style))


@app.command()
def plan(
    dsn: DsnOption = None,
    sandbox: SandboxOption = False,
    connect_timeout: ConnectTimeoutOption = 10,
    output_format: FormatOption = OutputFormat.table,
    assume_release: AssumeReleaseOption = None,
) -> None:
    """List what `migrate apply` would do, in order, and which path each migration takes here. Read-only.

    A database installed by a published pgflow release is recognised from its catalog; the plan then starts
    with its adoption (adopt release X -> baseline) and says what to do about its workers, pg_cron jobs and
    the Supabase migration history. Runs the preflight audit of migrations that ask for one. Exit 0 when
    apply may proceed, 1 when the preflight audit would refuse it (blocking findings), 6 for a state conflict
    (changed files, newer database, a pgflow schema that matches no release).
    """
    STATE.output_format = output_format
    conn, target = open_connection(dsn, sandbox, connect_timeout)
    refused: PgflowError | None = None
    with conn:
        the_plan = installer.make_plan(conn)
        found = upstream.inspect(conn, assume_release=assume_release)
        conflict = _conflict(the_plan, found)
        todo = _after_adoption(the_plan, found)
        if not conflict:
            try:
                migrate_op.preflight(conn, todo)
            except Refused as exc:
                refused = exc
        paths = {m.version: (m.phased.path(conn) if m.phased else "one transaction") for m in todo}
    pending = [{"version": m.version, "name": m.name, "summary": _summary(m), "checksum": m.checksum,
                "state": next(s.state for s in the_plan.statuses if s.version == m.version),
                "path": paths[m.version], "preflight_audit": m.preflight_audit,
                "worker_protocol": m.worker_protocol}
               for m in todo]
    if output_format == OutputFormat.json:
        render.write_json({
            "kind": "pgflow-cli/migrate-plan", "version": 1, "database": target.describe(),
            "upstream": found.to_dict(),
            "pending": pending, "pgmq_installed": the_plan.state.has_pgmq_meta,
            "conflict": conflict.to_dict() if conflict else None,
            "refused": refused.to_dict() if refused else None,
        })
    elif output_format == OutputFormat.csv:
        render.write_csv(["version", "name", "summary", "checksum"], pending)
    else:
        console = render.stdout_console()
        _print_upstream(found)
        if not pending and not found.steps:
            console.print(render.text("nothing to apply: the database is up to date", "green"))
        for item in pending:
            notes = []
            if item["state"] == "in_progress":
                notes.append("in progress: apply resumes it")
            notes.append(f"path: {item['path']}")
            if item["preflight_audit"]:
                notes.append("preflight audit")
            if item["worker_protocol"]:
                notes.append(f"switches workers to protocol {item['worker_protocol']}: fence and drain them first")
            suffix = f" [{'; '.join(notes)}]" if notes else ""
            console.print(render.text(f"{item['version']:04d}_{item['name']}: {item['summary']}{suffix}"))
        if (pending or found.steps) and not conflict and not refused:
            console.print(render.text("next: pgflow migrate apply --dry-run, then pgflow migrate apply", "dim"))
        if not the_plan.state.has_pgmq_meta:
            console.print(render.text("PGMQ is not installed: install the pgmq extension or use --install-pgmq", "yellow"))
    problem = conflict or refused
    if problem:
        from pgflow_cli.cli import report_error

        report_error(problem)
        raise typer.Exit(int(problem.exit_code))


@app.command()
def apply(
    dsn: DsnOption = None,
    sandbox: SandboxOption = False,
    connect_timeout: ConnectTimeoutOption = 10,
    output_format: FormatOption = OutputFormat.table,
    target_version: Annotated[
        Optional[int], typer.Option("--target", min=1, metavar="N", help="Apply up to and including this migration number.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Run the next pending migration and roll it back: rows touched, locks held, time.")
    ] = False,
    show_sql: Annotated[
        bool, typer.Option("--sql", help="Print the SQL of the pending migrations for review and exit; changes nothing.")
    ] = False,
    lock_timeout: Annotated[
        float, typer.Option("--lock-timeout", min=0.1, metavar="SECONDS",
                            help="Seconds a statement may wait for a lock before the migration is rolled back and retried.")
    ] = 5.0,
    retries: Annotated[
        int, typer.Option("--retries", min=1, max=50, metavar="N", help="Attempts per transaction, on lock timeouts and deadlocks only.")
    ] = 5,
    install_pgmq: Annotated[
        bool, typer.Option("--install-pgmq", help="Install the PGMQ SQL bundled with pgflow-cli when the database has no PGMQ.")
    ] = False,
    online: Annotated[
        OnlineMode, typer.Option("--online", case_sensitive=False,
                                 help="Phased migrations: auto commits phase by phase (short locks, batched backfill) "
                                 "only when the task table is large; always or never force the choice.")
    ] = OnlineMode.auto,
    batch_seconds: Annotated[
        float, typer.Option("--batch-seconds", min=0.01, max=60, metavar="SECONDS",
                            help="Phased path: how long each backfill batch may keep its rows locked (batches adapt to it).")
    ] = 0.2,
    assume_release: AssumeReleaseOption = None,
) -> None:
    """Apply pending migrations in order; each one is atomic and recorded with its checksum.

    A lock that cannot be taken within --lock-timeout rolls the transaction back; it is retried with backoff
    up to --retries times, naming the sessions that block it (never their queries).

    Exit 0 applied (or nothing pending); 1 refused by the preflight audit or the recheck under the locks
    (nothing changed); 3 cannot connect, no PGMQ, a hot standby or a read-only session; 4 a lock never became
    free (the database is as before that transaction); 6 changed migration files, a newer database, another
    migrator holding the migrator lock, or a pgflow schema that matches no published release (adopt it anyway
    with --assume-release); 130 Ctrl-C (the message says what was left and how to go on). A database installed by pgflow itself is
    adopted first, in one transaction (with --dry-run: only the adoption runs, rolled back).
    Read docs/upgrade.md first: workers must be fenced and drained for an upgrade that changes their protocol.
    """
    STATE.output_format = output_format
    if dry_run and install_pgmq:
        raise UsageError("--dry-run cannot be combined with --install-pgmq: installing PGMQ is not rolled back",
                         hint="install PGMQ first (migrate apply --install-pgmq --target 1), or drop --install-pgmq")
    conn, target = open_connection(dsn, sandbox, connect_timeout)
    err = render.stderr_console()
    with conn:
        if show_sql:
            the_plan = installer.make_plan(conn)
            found = upstream.inspect(conn, assume_release=assume_release)
            conflict = _conflict(the_plan, found)
            if conflict:
                raise conflict
            if found.adoption_pending:
                typer.echo(f"-- ===== {found.steps[0]} =====")
                typer.echo(upstream.sql_script(conn, found).rstrip("\n"))
            todo = [m for m in _after_adoption(the_plan, found) if target_version is None or m.version <= target_version]
            for migration in todo:
                typer.echo(f"-- ===== {migration.label} (sha256 {migration.checksum}) =====")
                locks = migration.locks_for([None, *(p.name for p in migration.phases_for_single_transaction())])
                if locks:
                    typer.echo("-- taken first, all or none, on the one-transaction path (each phase takes its own "
                               "--@lock lines): " + ", ".join(f"{lock.table} {lock.mode}" for lock in locks))
                typer.echo(migration.sql.rstrip("\n"))
            if not todo and not found.adoption_pending:
                err.print("nothing pending")
            return

        def progress(event: str, data: dict[str, Any]) -> None:
            # json/csv: stderr carries one JSON error document at most (blockers go into its detail)
            if output_format != OutputFormat.table:
                return
            if event == "lock_wait":
                holder = data["described"][0] if data["described"] else "a session"
                err.print(render.text(f"another migrator holds the lock: {holder}; waiting up to "
                                      f"{data['wait_seconds']:g} s for it to finish...", "yellow"))
            elif event == "pgmq_installed":
                err.print(render.text(f"installed PGMQ {data['version']} (SQL bundled with pgflow-cli)"))
            elif event == "workers_alive":
                err.print(render.text(
                    f"warning: {data['alive']} worker(s) have a recent heartbeat and {data['enabled_functions']} worker "
                    f"function(s) are enabled. After this upgrade only workers speaking protocol {data['protocol']} may "
                    "start; running ones will fail their next claim. Fence and drain them first (docs/upgrade.md step 2).",
                    "yellow"))
            elif event == "preflight":
                err.print(render.text(f"preflight audit: {data['findings']} finding(s), none blocking", "green"))
            elif event == "start":
                suffix = f" (attempt {data['attempt']})" if data["attempt"] > 1 else ""
                err.print(render.text(f"{'dry run of' if dry_run else 'applying'} {data['migration']}{suffix}..."))
            elif event == "blocked":
                waiting = data.get("waiting_on") or {}
                what = f"{waiting.get('mode', 'a lock')} on {waiting.get('object', '?')}" if waiting else "a lock"
                err.print(render.text(f"waiting for {what}, blocked by:", "yellow"))
                for blocker in data["blockers"]:
                    err.print(render.text(f"  {migrate_op.describe_blocker(blocker)}", "yellow"))
            elif event == "retry":
                err.print(render.text(
                    f"{data['migration']}: {data['error']}; rolled back, retrying in {data['sleep']}s", "yellow"))
            elif event == "phase":
                err.print(render.text(f"  phase {data['phase']} ({data['mode']})..."))
            elif event == "batch":
                done = min(data["first_page"] + data["pages"], data["relation_pages"])
                err.print(render.text(f"    backfill pages {done}/{data['relation_pages']}: {data['rows']} rows "
                                      f"in {data['ms']} ms", "dim"))
            elif event == "invalid_index":
                err.print(render.text(f"    dropping invalid index {data['index']} (left by an earlier concurrent "
                                      "build) before building it again", "yellow"))
            elif event == "done":
                verb = "rolled back (dry run)" if data["dry_run"] else "applied"
                err.print(render.text(f"{verb} {data['migration']} in {data['duration_ms']} ms", "green"))

        try:
            result = migrate_op.apply(
                conn, target, target_version=target_version, lock_timeout=lock_timeout, attempts=retries,
                dry_run=dry_run, progress=progress, online=OnlineMode(online).value, batch_seconds=batch_seconds,
                install_pgmq=install_pgmq, assume_release=assume_release,
            )
        except KeyboardInterrupt:
            interrupted = True
        else:
            interrupted = False
    if interrupted:  # the migrator's connection is closed now (its session lock released): read what is left
        raise migrate_op.interrupted(target)
    if output_format == OutputFormat.json:
        render.write_json({"kind": "pgflow-cli/migrate-apply", "version": 1, "database": target.describe(), **result.to_dict()})
        return
    if output_format == OutputFormat.csv:
        render.write_csv(["name", "seconds"], [{"name": p.name, "seconds": round(p.seconds, 3)} for p in result.phases])
        return
    console = render.stdout_console()
    if not result.phases:
        console.print(render.text("nothing to apply: the database is up to date", "green"))
    for phase in result.phases:
        console.print(render.text(f"{phase.name}: {phase.seconds:.3f}s"))
        if dry_run:
            for row in phase.detail.get("rows_touched", []):
                console.print(render.text(
                    f"  {row['table_name']}: +{row['inserted']} ~{row['updated']} -{row['deleted']} rows"))
            for lock in phase.detail.get("locks_held", []):
                console.print(render.text(f"  lock {lock['relation']}: {lock['modes']} for {lock['held_ms']} ms"))
    if dry_run and result.phases:
        console.print(render.text("dry run: everything was rolled back", "dim"))
        if result.adoption:
            console.print(render.text("the migrations after the baseline run once the adoption is applied "
                                      "(dry-run them then)", "dim"))
    elif result.applied and result.protocol_change:
        console.print(render.text(
            f"next: deploy workers speaking protocol {result.protocol_change['protocol']}, check that every route has a "
            "live worker, then lift the fence (docs/upgrade.md steps 6-7)", "dim"))



@app.command()
def abort(
    version: Annotated[int, typer.Argument(help="Number of the in-progress migration to undo, e.g. 3.")],
    dsn: DsnOption = None,
    sandbox: SandboxOption = False,
    connect_timeout: ConnectTimeoutOption = 10,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Undo the committed phases of a phased migration that did not finish (state in_progress).

    Runs the migration's abort phase in one transaction and forgets its ledger row; the database is then
    back to the schema before that migration. Exit 6 if the migration is not in progress.
    """
    import sys

    from pgflow_cli.errors import ExitCode

    if not yes:
        if not sys.stdin.isatty():
            raise UsageError("abort changes the schema; confirm with --yes when not on a terminal")
        if not typer.confirm(f"Undo the prepared phases of migration {version:04d}?", err=True):
            render.stderr_console().print("cancelled; nothing changed")
            raise typer.Exit(int(ExitCode.INTERRUPTED))
    conn, _target = open_connection(dsn, sandbox, connect_timeout)
    with conn:
        migration = installer.abort(conn, version)
    render.stderr_console().print(render.text(f"aborted {migration.label}: its prepared phases were undone", "green"))

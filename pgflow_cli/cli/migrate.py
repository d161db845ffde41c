"""``pgflow migrate``: status, plan and apply of the shipped SQL migrations."""

from __future__ import annotations

import enum
from typing import Annotated, Any

import typer

from pgflow_cli import render
from pgflow_cli.cli import common
from pgflow_cli.cli.common import ANY_TARGET, OutputFormat, TargetOptions
from pgflow_cli.errors import UsageError
from pgflow_cli.operations import migrate as migrate_op
from pgflow_cli.operations import pooler, upstream

DOCUMENT_VERSION = 2
"""Version of the migrate-plan/-apply JSON documents: 2 made ``database`` an object
(docs/schemas/migrate-*.schema.json)."""
STATUS_DOCUMENT_VERSION = 3
"""Version of the migrate-status document: 3 compares every function file with the catalog
(``files``: path, state, detail) instead of listing the per-file ledger's checksums."""

MIGRATOR_SESSION = ("holds the migrators' advisory lock for its whole session, across its transactions, and builds "
                    "indexes outside a transaction")
"""Why ``migrate apply`` and ``migrate abort`` refuse a connection pooler (:mod:`pgflow_cli.operations.pooler`)."""

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


AssumeReleaseOption = Annotated[
    str | None,
    typer.Option("--assume-release", metavar="X.Y.Z",
                 help="Treat an unrecognised pgflow schema as this published release and adopt it anyway; the "
                 "assertion and every difference are recorded (docs/upgrade.md).")
]


def _print_upstream(page: render.Page, found: upstream.UpstreamPlan) -> None:
    recognition = found.recognition
    if recognition.status in ("none", "pgflow-cli") and not found.completion:
        return
    summary = recognition.summary()
    page.line(summary if summary.startswith("unrecognised") else f"pgflow schema: {summary}",
              "bold red" if recognition.status == "unrecognised" else None)
    for difference in recognition.differences:
        page.line(f"  {difference.describe()}", "red" if not recognition.adoptable else "dim")
    for step in found.steps:
        page.line(f"step: {step}")
    for item in found.must_do:
        page.line(f"  must: {item}", "yellow")
    for note in found.notes:
        page.line(f"  note: {note}", "dim")


def _document(kind: str, target: Any, body: dict[str, Any], version: int = DOCUMENT_VERSION) -> dict[str, Any]:
    return common.versioned({"kind": f"pgflow-cli/{kind}", "version": version, **body}, target)


STATUS_COLUMNS = ["version", "name", "state", "applied_at", "applied_by", "tool_version", "duration_ms", "summary"]


@app.command()
@common.option_groups
def status(
    where: TargetOptions = ANY_TARGET,
    output_format: common.FormatOption = OutputFormat.table,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Also each migration's summary and every function file (by default only drifted "
        "ones).")] = False,
) -> None:
    """Show applied, pending, in-progress, changed (checksum mismatch), unknown and superseded migrations,
    functions that differ from their files, invalid indexes, and which pgflow release installed a schema
    pgflow-cli did not (or adopted). Read-only.

    The verdict comes first (up to date, N pending, in progress, drift, or why this tool cannot migrate the
    database) with the command that moves on, then one line per migration; function files only when one
    drifted (all of them, and each migration's summary, with --verbose).

    Exit 0 up to date or only pending (a ledger of an earlier build that apply converts included); 1 a migration
    in progress (resume or abort it), an installed function that differs from its file, or an invalid index;
    6 when this tool cannot migrate the database (changed files, a newer database, an earlier build's
    migrations stopped part way, a pgflow schema that matches no published release).

    \b
    Examples:
      pgflow migrate status
      pgflow migrate status --verbose --format plain
      pgflow migrate status --format json | jq .verdict
    """
    common.STATE.output_format = output_format
    conn, target = where.open()
    with conn:
        report = migrate_op.status(conn)
    plan = report.plan
    rows = migrate_op.status_rows(plan)
    if output_format == OutputFormat.json:
        render.write_json(_document("migrate-status", target, {
            "pgmq_version": plan.state.pgmq_version,
            "migrations": [{k: v for k, v in row.items() if k != "label"} for row in rows], **report.to_dict(),
        }, STATUS_DOCUMENT_VERSION))
    elif output_format == OutputFormat.csv:
        render.write_csv(STATUS_COLUMNS, rows)
    else:
        page = render.Page(output_format.value)
        _print_status(page, rows, target.describe(), report, verbose)
        if report.found is not None:
            _print_upstream(page, report.found)
    if report.conflict:
        from pgflow_cli.cli import report_error

        report_error(report.conflict)
    if report.exit_code:
        raise typer.Exit(int(report.exit_code))


STATE_STYLES = {"applied": "green", "pending": "yellow", "in_progress": "bold yellow", "changed": "bold red",
                "unknown": "bold red", "superseded": "dim"}

STATUS_TABLE = [
    render.Column("label", "migration"),
    render.Column("state", "state"),
    render.Column("applied", "applied (UTC)", drop=2),
    render.Column("applied_by", "by", drop=4),
    render.Column("tool_version", "tool", drop=5),
    render.Column("seconds", "s", drop=3, justify="right"),
]
"""``migrate status``: one line per migration at any width; migration and state always, the rest go first."""

SUMMARY_COLUMN = render.Column("summary", "summary", drop=1, wrap=True)
"""Each migration's summary (``--verbose``)."""

FILES_TABLE = [
    render.Column("file", "function file", wrap=True),
    render.Column("state", "state"),
    render.Column("detail", "what differs", drop=1, wrap=True),
]

def _print_status(page: render.Page, rows: list[dict[str, Any]], where: str, report: migrate_op.StatusReport,
                  verbose: bool = False) -> None:
    style = {"up_to_date": "green", "pending": "yellow"}.get(report.verdict, "bold red")
    verdict = report.lines() or ["up to date"]  # what is true, each with the command that moves on
    page.line(common.with_target(f"{where}: {verdict[0]}"), style)
    for line in verdict[1:]:
        page.line(common.with_target(line), style)
    applied = sum(1 for row in rows if row["state"] == "applied")
    shown = [{**row, "applied": row["applied_at"].strftime("%Y-%m-%d %H:%M:%S") if row["applied_at"] else "",
              "seconds": "" if row["duration_seconds"] is None else f"{row['duration_seconds']:.1f}"}
             for row in rows]
    page.table([*STATUS_TABLE, SUMMARY_COLUMN] if verbose else STATUS_TABLE, shown,
               title=f"migrations ({applied} of {len(rows)} applied)",
               style=lambda key, row: STATE_STYLES.get(row["state"]) if key == "state" else None)
    drift = {f.path for f in report.plan.file_drift}
    listed = [f for f in report.plan.files if verbose or f.path in drift]
    if listed:
        files = [{"file": f"sql/{f.path}", "state": f.state, "drift": f.path in drift, "detail": "; ".join(f.detail)}
                 for f in listed]
        page.blank()
        page.table(FILES_TABLE, files, title="function files" if verbose else "function files that differ from the database",
                   style=lambda key, row: None if key != "state" else
                   "green" if row["state"] == "current" else "bold red" if row["drift"] else "yellow")
    elif report.plan.files:
        page.line(f"function files: none drifted (--verbose lists all {len(report.plan.files)})", "dim")
    page.line(f"PGMQ: {report.plan.state.pgmq_version or 'not installed'}")


@app.command()
@common.option_groups
def plan(
    where: TargetOptions = ANY_TARGET,
    output_format: common.FormatOption = OutputFormat.table,
    assume_release: AssumeReleaseOption = None,
) -> None:
    """List what `migrate apply` would do, in order, and which path each migration takes here. Read-only.

    A database installed by a published pgflow release is recognised from its catalog; the plan then starts
    with its adoption (adopt release X -> baseline) and says what to do about its workers, pg_cron jobs and
    the Supabase migration history. Runs the preflight audit of migrations that ask for one. Exit 0 when
    apply may proceed, 1 when the preflight audit would refuse it (blocking findings), 6 for a state conflict
    (changed files, newer database, a pgflow schema that matches no release).

    \b
    Examples:
      pgflow migrate plan
      pgflow migrate plan --format json | jq .next
    """
    common.STATE.output_format = output_format
    conn, target = where.open()
    with conn:
        report = migrate_op.make_plan(conn, assume_release=assume_release)
    if output_format == OutputFormat.json:
        body = report.to_dict()
        body["next"] = [common.with_target(command, note=False) for command in report.next]
        render.write_json(_document("migrate-plan", target, body))
    elif output_format == OutputFormat.csv:
        render.write_csv(["version", "name", "state", "path", "preflight_audit", "worker_protocol", "summary",
                          "checksum"], report.pending)
    else:
        page = render.Page(output_format.value)
        _print_upstream(page, report.found)
        if not report.pending and not report.found.steps:
            page.line("nothing to apply: the database is up to date", "green")
        for item in report.pending:
            notes = []
            if item["state"] == "in_progress":
                notes.append("in progress: apply resumes it")
            notes.append(f"path: {item['path']}")
            if item["preflight_audit"]:
                notes.append("preflight audit")
            if item["worker_protocol"]:
                notes.append(f"switches workers to protocol {item['worker_protocol']}: fence and drain them first")
            page.line(f"{item['version']:04d}_{item['name']}: {item['summary']} [{'; '.join(notes)}]")
        for note in report.notes:
            page.line(common.with_target(note), "yellow")
        if report.next:
            joiner = " or " if report.choice else ", then "
            page.line(common.with_target("next: " + joiner.join(report.next)), "dim")
    if report.problem:
        from pgflow_cli.cli import report_error

        report_error(report.problem)
        raise typer.Exit(int(report.problem.exit_code))


@app.command()
@common.option_groups
def apply(
    where: TargetOptions = ANY_TARGET,
    output_format: common.FormatOption = OutputFormat.table,
    target_version: Annotated[
        int | None, typer.Option("--target", min=1, metavar="N", help="Apply up to and including this migration number.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Run the next pending migration and roll it back: rows touched, locks held, time.")
    ] = False,
    show_sql: Annotated[
        bool, typer.Option("--sql", help="Print the pending migrations as a script psql runs as is (the one-transaction path: "
                            "phases as comments, no placeholders, ledger rows included) and exit; changes nothing.")
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
    full: Annotated[
        bool, typer.Option("--full", help="Dry run: list every table touched and every lock held (default: the first "
                           f"{5} of each and a summary of the rest).")
    ] = False,
    fill_history: Annotated[
        bool, typer.Option("--fill-history", help="After the migrations, store the step outputs of runs that finished "
                           "before an adoption of pgflow 0.8-0.12 (online, resumable; get_run_with_states computes "
                           "them without it).")
    ] = False,
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

    \b
    Examples:
      pgflow migrate apply --dry-run
      pgflow migrate apply
      pgflow migrate apply --sql > upgrade.sql
      pgflow migrate apply --install-pgmq
    """
    common.STATE.output_format = output_format
    if dry_run and install_pgmq:
        raise UsageError("--dry-run cannot be combined with --install-pgmq: installing PGMQ is not rolled back",
                         hint="install PGMQ first (migrate apply --install-pgmq --target 1), or drop --install-pgmq")
    conn, target = where.open()
    err = render.stderr_console()
    with conn:
        if show_sql:
            script = migrate_op.sql_script(conn, target_version=target_version, assume_release=assume_release,
                                           online=OnlineMode(online).value, lock_timeout=lock_timeout)
            if script.text:
                typer.echo(script.text.rstrip("\n"))
            for note in script.notes:
                err.print(render.text(common.with_target(note), "yellow"))
            return
        pooler.require_direct_session(conn, target, "pgflow migrate apply", MIGRATOR_SESSION)

        def progress(event: migrate_op.events.Event) -> None:
            # json/csv: stderr carries one JSON error document at most (blockers go into its detail)
            if output_format.human:
                for text, style in describe_event(event, dry_run):
                    err.print(render.text(text, style))

        try:
            result = migrate_op.apply(
                conn, target, target_version=target_version, lock_timeout=lock_timeout, attempts=retries,
                dry_run=dry_run, progress=progress, online=OnlineMode(online).value, batch_seconds=batch_seconds,
                install_pgmq=install_pgmq, assume_release=assume_release, fill_history=fill_history,
            )
        except KeyboardInterrupt:
            interrupted = True
        else:
            interrupted = False
    if interrupted:  # the migrator's connection is closed now (its session lock released): read what is left
        raise migrate_op.interrupted(target)
    if output_format == OutputFormat.json:
        render.write_json(_document("migrate-apply", target, result.to_dict()))
        return
    if output_format == OutputFormat.csv:
        render.write_csv(["name", "seconds"], [{"name": p.name, "seconds": round(p.seconds, 3)} for p in result.phases])
        return
    page = render.Page(output_format.value)
    if not result.phases:
        page.line("nothing to apply: the database is up to date", "green")
    for phase in result.phases:
        page.line(f"{phase.name}: {phase.seconds:.3f}s")
        if dry_run:
            _print_measured(page, phase.detail, full)
    for line in (result.adoption or {}).get("mended", []):
        page.line(f"adoption mended: {line}", "yellow")
    if dry_run and result.phases:
        page.line("dry run: everything was rolled back", "dim")
        if result.adoption:
            page.line("the migrations after the baseline run once the adoption is applied (dry-run them then)", "dim")
        else:
            page.line(common.with_target("next: pgflow migrate apply"), "dim")
    elif result.applied and result.protocol_change:
        page.line(common.with_target(
            f"next: deploy workers speaking protocol {result.protocol_change['protocol']}, check that every route has "
            "a live worker (pgflow coverage), then restore the fence if you set one (pgflow fence status; "
            "docs/upgrade.md steps 6-7)"), "dim")


def describe_event(event: migrate_op.events.Event, dry_run: bool = False) -> list[tuple[str, str | None]]:
    """What ``migrate apply`` prints on stderr for one progress event: ``(line, style)`` pairs, none
    for an event it does not show (a phase that ended, a late lock given back: the next line says
    what happens).

    Raises:
        TypeError: an event kind this function does not know (a test gives it every kind).
    """
    ev = migrate_op.events
    match event:
        case ev.MigratorLockWait(holders=holders, wait_seconds=wait):
            return [(f"another migrator holds the lock: {holders[0] if holders else 'a session'}; waiting up to "
                     f"{wait:g} s for it to finish...", "yellow")]
        case ev.PgmqInstalled(version=version):
            return [(f"installed PGMQ {version} (SQL bundled with pgflow-cli)", None)]
        case ev.WorkersAlive():
            return [(f"warning: {event.alive} worker(s) have a recent heartbeat and {event.enabled_functions} worker "
                     f"function(s) are enabled. After this upgrade only workers speaking protocol {event.protocol} may "
                     "start; running ones will fail their next claim. Fence and drain them first (docs/upgrade.md "
                     "step 2).", "yellow")]
        case ev.PreflightPassed(findings=findings):
            return [(f"preflight audit: {findings} finding(s), none blocking", "green")]
        case ev.StepStarted(step=step, attempt=attempt):
            suffix = f" (attempt {attempt})" if attempt > 1 else ""
            return [(f"{'dry run of' if dry_run else 'applying'} {step}{suffix}...", None)]
        case ev.Blocked(blockers=blockers, waiting_on=waiting):
            what = f"{waiting.get('mode', 'a lock')} on {waiting.get('object', 'an object')}" if waiting else "a lock"
            return [(f"waiting for {what}, blocked by:", "yellow"),
                    *[(f"  {migrate_op.describe_blocker(blocker)}", "yellow") for blocker in blockers]]
        case ev.Retrying(step=step, error=error, sleep=sleep):
            return [(f"{step}: {error}; rolled back, retrying in {sleep}s", "yellow")]
        case ev.PhaseStarted(phase=phase, mode=mode):
            return [(f"  phase {phase} ({mode})...", None)]
        case ev.BatchDone():
            done = min(event.first_page + event.pages, event.relation_pages)
            return [(f"    backfill pages {done}/{event.relation_pages}: {event.rows} rows in {event.ms} ms", "dim")]
        case ev.InvalidIndexDropped(index=index):
            return [(f"    dropping invalid index {index} (left by an earlier concurrent build) before building it "
                     "again", "yellow")]
        case ev.StepDone(step=step, duration_ms=ms, dry_run=rolled_back):
            return [(f"{'rolled back (dry run)' if rolled_back else 'applied'} {step} in {ms} ms", "green")]
        case ev.PhaseDone() | ev.LateLocksGivenBack():
            return []
    raise TypeError(f"no line for the event {event!r}")


SUMMARISED = 5
"""Rows-touched and lock lines a dry run shows per migration before summarising (``--full``: all)."""


def _print_measured(page: render.Page, detail: dict[str, Any], full: bool) -> None:
    touched = [row for row in detail.get("rows_touched", [])]
    locks = list(detail.get("locks_held", []))
    for row in touched if full else touched[:SUMMARISED]:
        page.line(f"  {row['table_name']}: +{row['inserted']} ~{row['updated']} -{row['deleted']} rows")
    if not full and len(touched) > SUMMARISED:
        page.line(f"  ... and {len(touched) - SUMMARISED} more table(s) (--full lists every one)", "dim")
    for lock in locks if full else locks[:SUMMARISED]:
        page.line(f"  lock {lock['relation']}: {lock['modes']} for {lock['held_ms']} ms")
    if not full and len(locks) > SUMMARISED:
        modes = sorted({mode for lock in locks for mode in str(lock["modes"]).split(", ")})
        page.line(f"  ... and {len(locks) - SUMMARISED} more lock(s) of {len(locks)} in all ({', '.join(modes)}; "
                  "--full lists every one)", "dim")


@app.command()
@common.option_groups
def abort(
    version: Annotated[int, typer.Argument(help="Number of the in-progress migration to undo, e.g. 3.")],
    where: TargetOptions = ANY_TARGET,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Undo the committed phases of a phased migration that did not finish (state in_progress).

    Runs the migration's abort phase in one transaction and forgets its ledger row; the database is then
    back to the schema before that migration. Exit 6 if the migration is not in progress.

    \b
    Examples:
      pgflow migrate abort 3
      pgflow migrate abort 3 --yes
    """
    import sys

    from pgflow_cli.errors import ExitCode

    if not yes:
        if not sys.stdin.isatty():
            raise UsageError("abort changes the schema; confirm with --yes when not on a terminal")
        if not typer.confirm(f"Undo the prepared phases of migration {version:04d}?", err=True):
            render.stderr_console().print("cancelled; nothing changed")
            raise typer.Exit(int(ExitCode.INTERRUPTED))
    conn, target = where.open()
    with conn:
        pooler.require_direct_session(conn, target, "pgflow migrate abort", MIGRATOR_SESSION)
        label = migrate_op.abort(conn, version)
    render.stderr_console().print(render.text(f"aborted {label}: its prepared phases were undone", "green"))

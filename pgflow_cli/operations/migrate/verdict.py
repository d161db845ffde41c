"""What is true about one database's migrations: ``migrate status``, its verdict and exit code, and
what to say after Ctrl-C."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgflow_cli import installer
from pgflow_cli.db import Target, connect
from pgflow_cli.errors import ExitCode, PgflowError
from pgflow_cli.installer import shapes
from pgflow_cli.operations import schema, upstream


@dataclass
class StatusReport:
    """The truth about one database's migrations, for ``pgflow migrate status`` and after Ctrl-C.

    Attributes:
        plan: the installer's comparison of the shipped files with the ledger.
        verdict: ``conflict`` (changed checksum, newer database, foreign pgflow: nothing can be
            applied), ``in_progress`` (a phased run stopped part way), ``broken`` (a table, column,
            constraint, index or trigger the runtime needs is missing or changed:
            :func:`pgflow_cli.operations.schema.database_breaks`), ``drift`` (installed
            function text differs from the files, or an invalid index is left, with nothing
            pending to fix it), ``pending`` (migrations, or the online completion of an
            adoption: its index and validations) or ``up_to_date`` (an optional history
            backfill may be left: a note says so).
        conflict: the error ``migrate apply`` would refuse with (``verdict == "conflict"``): an
            unrecognised upstream schema, or the ledger's conflict when nothing is to be adopted.
        found: which release installed a pgflow schema pgflow-cli did not (or adopted), and what
            adopting it involves (:func:`pgflow_cli.operations.upstream.inspect`).
        breaks: what the runtime needs and the schema lacks, one line each.
    """

    plan: installer.Plan
    verdict: str
    conflict: PgflowError | None
    found: upstream.UpstreamPlan | None = None
    breaks: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        """0 up to date or only pending; 1 in progress, broken or drift (operator work); 6 conflict
        (docs/exit-codes.md)."""
        if self.verdict == "conflict":
            return ExitCode.CONFLICT
        if self.verdict in ("in_progress", "broken", "drift"):
            return ExitCode.FINDINGS
        return ExitCode.OK

    def lines(self) -> list[str]:
        """What is true, one sentence a line, each with the command that moves on from it."""
        plan = self.plan
        out = []
        for s in plan.in_progress:
            done = ", ".join(s.recorded.phases_done) if s.recorded and s.recorded.phases_done else "none"
            out.append(f"migration {s.version:04d}_{s.name} is IN PROGRESS (committed phases: {done}); the database "
                       f"keeps its old behaviour until the last phase commits: resume with `pgflow migrate apply`, "
                       f"or undo with `pgflow migrate abort {s.version}`")
        for line in self.breaks:
            out.append(f"BROKEN: {line}; restore it as pgflow-cli created it (docs/upgrade.md \"A broken runtime "
                       "schema\")")
        for index in plan.invalid_indexes:
            out.append(f"index {index} is INVALID (left by an interrupted concurrent build); `pgflow migrate apply` "
                       "drops and rebuilds it")
        for f in plan.file_drift:
            what = "is not installed" if f.state == "missing" else "is installed with another definition"
            out.append(f"function file sql/{f.path} {what} ({'; '.join(f.detail)}): the database differs from this "
                       "tool's file and no migration is pending")
        pending = [s for s in plan.statuses if s.state == "pending"]
        if self.verdict == "conflict":
            out.append("NOT up to date: this tool cannot migrate this database (see the error below)")
        elif plan.conversion is not None:
            out.append(installer.conversion_sentence(plan) + "; next: pgflow migrate plan")
        elif pending and self.found is not None and self.found.adoption_pending:
            out.append(f"{len(pending)} pending, the baseline through adoption; next: pgflow migrate plan")
        elif pending:
            out.append(f"{len(pending)} pending ({', '.join(f'{s.version:04d}' for s in pending)}); "
                       "next: pgflow migrate plan")
        elif self.found is not None and self.found.completion:
            out.append("migrations up to date; the adoption is not finished: "
                       + "; ".join(self.found.steps) + "; next: pgflow migrate apply")
        elif self.verdict == "up_to_date":
            out.append("up to date")
        return out

    def to_dict(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "verdict": self.verdict,
            "pending": [m.version for m in plan.pending],
            "in_progress": [{"version": s.version, "phases_done": list(s.recorded.phases_done) if s.recorded else []}
                            for s in plan.in_progress],
            "changed": [s.version for s in plan.changed],
            "unknown": [s.version for s in plan.unknown],
            "invalid_indexes": list(plan.invalid_indexes),
            "breaks": list(self.breaks),
            "files": [f.to_dict() for f in plan.files],
            "file_drift": [f.path for f in plan.file_drift],
            "installed": self.found.recognition.summary() if self.found else None,
            "upstream": self.found.to_dict() if self.found else None,
            "conflict": self.conflict.to_dict() if self.conflict else None,
        }


def blocking_conflict(plan: installer.Plan, found: upstream.UpstreamPlan) -> PgflowError | None:
    """What stops ``apply`` here: a foreign ``pgflow.schema_migrations`` or a partial pgflow schema
    (no ``pgflow.flows``: not a release's schema either), else an unrecognised upstream schema,
    else the ledger's conflicts; a recognised upstream schema (or one whose release is asserted)
    is adopted instead.

    Args:
        plan: :func:`pgflow_cli.installer.make_plan` of the database.
        found: :func:`pgflow_cli.operations.upstream.inspect` of the same database.

    Returns:
        The error ``migrate apply`` would refuse with (exit 6), or ``None``.
    """
    if plan.state.foreign_ledger or plan.state.partial_pgflow:
        return plan.refuse_reasons()
    refused = upstream.refusal(found)
    if refused is not None:
        return refused  # type: ignore[return-value]
    if found.adoption_pending:
        return None
    return plan.refuse_reasons()


def status(conn: psycopg.Connection) -> StatusReport:
    """Read the ledger, the function-file records, invalid indexes and which release installed the
    schema (read-only) and judge them.

    Returns:
        A :class:`StatusReport`; its ``exit_code`` is what ``migrate status`` exits with.
    """
    plan = installer.make_plan(conn)
    found = upstream.inspect(conn)
    conflict = blocking_conflict(plan, found)
    breaks = [shapes.describe(d) for d in schema.database_breaks(conn)]
    if conflict:
        verdict = "conflict"
    elif plan.in_progress:
        verdict = "in_progress"
    elif breaks:
        verdict = "broken"
    elif plan.file_drift or plan.invalid_indexes:
        verdict = "drift"
    elif plan.pending or found.completion:
        verdict = "pending"
    else:
        verdict = "up_to_date"
    return StatusReport(plan, verdict, conflict, found, breaks)


def interrupted(target: Target) -> PgflowError:
    """The error to report after Ctrl-C during ``migrate apply``: what state the database was left in.

    Reads the state over a new connection (the migrator's own connection was closed, which also
    released its migrator lock). Never raises: when the state cannot be read the message says so.

    Returns:
        A :class:`PgflowError` with exit code 130 (INTERRUPTED), the state in its detail and how
        to resume or abort in its hint.
    """
    try:
        conn = connect(target, application_name="pgflow-cli", connect_timeout=5)
        try:
            report = status(conn)
        finally:
            conn.close()
    except (PgflowError, psycopg.Error) as exc:
        return PgflowError("interrupted; the state afterwards could not be read",
                           hint="run `pgflow migrate status` to see what was applied", detail=[str(exc).splitlines()[0]],
                           exit_code=ExitCode.INTERRUPTED)
    plan = report.plan
    if plan.in_progress:
        first = plan.in_progress[0]
        return PgflowError(
            f"interrupted: migration {first.version:04d}_{first.name} is left in progress",
            detail=report.lines(),
            hint=f"resume with `pgflow migrate apply` (it continues after the last committed phase), or undo the "
            f"committed phases with `pgflow migrate abort {first.version}`",
            exit_code=ExitCode.INTERRUPTED)
    applied = [f"{s.version:04d}" for s in plan.statuses if s.state == "applied"]
    if report.found is not None and report.found.history and not report.found.completion and not plan.pending:
        return PgflowError(
            "interrupted while storing the step outputs of finished runs (--fill-history); the migrations are "
            "committed and nothing else is left",
            detail=[f"applied: {', '.join(applied) or 'none'}", *report.lines()],
            hint="rerun `pgflow migrate apply --fill-history` to continue at the recorded page (optional: "
            "get_run_with_states computes those outputs meanwhile)",
            exit_code=ExitCode.INTERRUPTED)
    if report.found is not None and report.found.completion and not plan.pending:
        return PgflowError(
            "interrupted after the migrations committed: the adoption's online completion is not finished",
            detail=[f"applied: {', '.join(applied) or 'none'}", *report.lines()],
            hint="rerun `pgflow migrate apply` to continue where it stopped (nothing else is left to apply)",
            exit_code=ExitCode.INTERRUPTED)
    return PgflowError(
        "interrupted: the migration's open transaction was rolled back; nothing of it was kept",
        detail=[f"applied: {', '.join(applied) or 'none'}", *report.lines()],
        hint="rerun `pgflow migrate apply` when ready" if plan.pending else "",
        exit_code=ExitCode.INTERRUPTED)


def summary(migration: installer.Migration) -> str:
    """The header sentence of a migration file (its first comment paragraph, up to the first period
    at the end of a line), without the ``-- NNNN`` prefix; the name in words when it has none."""
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
    joined = " ".join(parts)
    prefix = f"{migration.version:04d} "
    joined = joined[len(prefix):] if joined.startswith(prefix) else joined
    return joined or migration.name.replace("_", " ")


def status_rows(plan: installer.Plan) -> list[dict[str, Any]]:
    """One row per migration for ``migrate status`` (JSON ``migrations``, CSV, tables).

    Returns:
        Dicts with ``version`` (int), ``name``, ``label`` (``NNNN_name``), ``state`` (``applied``,
        ``pending``, ``in_progress``, ``changed``, ``unknown``, ``superseded``), ``summary``, ``applied_at``
        (datetime, UTC, or None), ``applied_by``, ``tool_version``, ``duration_ms`` (int ms),
        ``duration_seconds`` (float s), ``checksum`` (hex).
    """
    by_version = {m.version: m for m in installer.available_migrations()}
    rows = []
    for s in plan.statuses:
        recorded = s.recorded
        applied_at = recorded.applied_at if recorded else None
        if isinstance(applied_at, dt.datetime):
            applied_at = applied_at.astimezone(dt.timezone.utc)
        duration_ms = recorded.duration_ms if recorded else None
        rows.append({
            "version": s.version,
            "name": s.name,
            "label": f"{s.version:04d}_{s.name}",
            "state": s.state,
            "summary": (f"pgflow-cli {installer.old_levels.OLD_BUILD}'s migration, replaced by one migration "
                        f"({by_version[installer.old_levels.FIRST].label})") if s.state == "superseded"
            else summary(by_version[s.version]) if s.version in by_version else "",
            "applied_at": applied_at,
            "applied_by": recorded.applied_by if recorded else None,
            "tool_version": recorded.tool_version if recorded else None,
            "duration_ms": duration_ms,
            "duration_seconds": None if duration_ms is None else round(duration_ms / 1000, 3),
            "checksum": s.file_checksum or (recorded.checksum if recorded else None),
        })
    return rows

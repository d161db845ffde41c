"""``pgflow audit``: render the read-only pre-upgrade report (docs/audit.md)."""

from __future__ import annotations

import enum
import sys
from collections.abc import Sequence
from typing import Annotated

import typer
from rich.padding import Padding
from rich.text import Text

from pgflow_cli import render
from pgflow_cli.cli import common
from pgflow_cli.cli.common import ANY_TARGET, OutputFormat, TargetOptions
from pgflow_cli.operations import audit as audit_op


class FailOn(str, enum.Enum):
    """Lowest severity that makes ``pgflow audit`` exit 1."""

    error = "error"
    warning = "warning"
    never = "never"


CSV_COLUMNS = [
    "check_id", "severity", "blocking", "flow_slug", "step_slug", "object_type", "object_name",
    "reasons", "evidence", "message", "fix",
]
"""One CSV row per finding, in this column order (docs/audit.md)."""

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}

SUMMARY_COLUMNS = [
    render.Column("severity", "severity"),
    render.Column("findings", "findings", justify="right"),
    render.Column("blocking", "blocking", justify="right"),
]

HELP = """Read-only pre-upgrade report: every flow and step name the queue-identity release rejects
(with every reason), case-only conflicts, PGMQ queue hazards, and the data at stake per flow.

Runs in one READ ONLY transaction, creates nothing, and needs only USAGE on the schemas pgflow and
pgmq and SELECT on their tables. Blocking findings make `pgflow migrate` refuse; nothing is ever
renamed or deleted by the tool. The same SQL runs in psql: `pgflow audit --print-sql > audit.sql`.

Exit 0: nothing at or above --fail-on. Exit 1: findings at or above --fail-on. Exit 3: cannot
connect, or no pgflow schema / PGMQ. Exit 6: a --flow that names no flow. Details: docs/audit.md.

\b
Examples:
  pgflow audit --sandbox
  pgflow audit --flow orders --format json > audit.json
  pgflow audit --fail-on error
  pgflow audit --print-sql > audit.sql"""


def register(app: typer.Typer) -> None:
    """Attach ``audit`` to the root command."""
    app.command("audit", help=HELP)(common.option_groups(audit))


def audit(
    where: TargetOptions = ANY_TARGET,
    output_format: common.FormatOption = OutputFormat.table,
    flow: Annotated[
        list[str] | None,
        typer.Option(
            "--flow",
            help="Report only on this flow (exact slug; repeat for several). Findings that touch it are kept "
            "whole, e.g. a case-conflict group with one selected member.",
            metavar="SLUG",
            show_default=False,
        ),
    ] = None,
    fail_on: Annotated[
        FailOn,
        typer.Option("--fail-on", help="Exit 1 when a finding of this severity or worse exists (info never fails).",
                     case_sensitive=False),
    ] = FailOn.warning,
    statement_timeout: Annotated[
        float,
        typer.Option("--statement-timeout", min=0, help="Seconds each audit statement may run (0: no limit).",
                     metavar="SECONDS"),
    ] = 120.0,
    print_sql: Annotated[
        bool,
        typer.Option("--print-sql", help="Print the audit as one psql script (BEGIN READ ONLY ... ROLLBACK) and exit; "
                     "no database is contacted."),
    ] = False,
) -> None:
    common.STATE.output_format = output_format
    if print_sql:
        sys.stdout.write(audit_op.psql_script())
        sys.stdout.flush()
        return
    err = render.stderr_console()
    verbose = output_format.human
    with where.connected() as (conn, target):
        if verbose:
            err.print(render.text(f"auditing {target.describe()} (read-only)", "dim"))
        report = audit_op.run_audit(conn, flow, statement_timeout=statement_timeout or None)
    if verbose:
        err.print(render.text(
            f"audit finished in {report.duration_ms} ms ({report.statements} statements, one read-only transaction)",
            "dim"))

    if output_format == OutputFormat.json:
        render.write_json(common.versioned(report.to_document(fail_on.value), target))
    elif output_format == OutputFormat.csv:
        render.write_csv(CSV_COLUMNS, [_csv_row(f) for f in report.findings])
    else:
        _render_table(report, fail_on.value, render.Page(output_format.value))
    code = report.exit_code(fail_on.value)
    if code:
        raise typer.Exit(code)


def _csv_row(finding: audit_op.Finding) -> dict[str, object]:
    row = finding.to_dict()
    row["blocking"] = "true" if finding.blocking else "false"
    row["reasons"] = ";".join(finding.reasons)
    return row


# --------------------------------------------------------------------------------------------
# table rendering: every value goes through render.text()/render.display()
# --------------------------------------------------------------------------------------------


def _render_table(report: audit_op.AuditReport, fail_on: str, page: render.Page) -> None:
    schema = report.schema
    page.print(Text.assemble(
        ("pgflow audit", "bold"), " of database ", render.text(schema.database, "bold"),
        " as role ", render.text(schema.role),
    ))
    pgmq = f"PGMQ {schema.pgmq_version} ({schema.pgmq_version_source})" if schema.pgmq_version else "PGMQ (version unknown)"
    page.print(render.text(
        f"PostgreSQL {schema.server_version} · {pgmq} · {_installed(schema)} · "
        f"{len(schema.pgflow_tables)} pgflow tables", "dim"))
    for note in schema.notes:
        page.print(render.text(f"  note: {note}", "dim"))
    if report.flow_filter:
        page.print(render.text("  filter: --flow " + " --flow ".join(report.flow_filter), "dim"))
    page.print()

    by_flow: dict[str | None, list[audit_op.Finding]] = {}
    for finding in report.findings:
        by_flow.setdefault(finding.flow_slug, []).append(finding)
    impacts = {impact.flow_slug: impact for impact in report.flows}

    def group_key(slug: str | None) -> tuple[int, int, str]:
        worst = min(audit_op.SEVERITIES.index(f.severity) for f in by_flow[slug])
        return (1 if slug is None else 0, worst, slug or "")

    for slug in sorted(by_flow, key=group_key):
        findings = by_flow[slug]
        if slug is None:
            title = Text("queues no flow owns", style="bold")
        else:
            title = Text.assemble(("flow ", "bold"), render.text(slug, "bold"))
            if any(f.blocking for f in findings):
                title.append("  [blocks the upgrade]", style="bold red")
        page.print(title)
        impact = impacts.get(slug) if slug is not None else None
        if impact is not None:
            page.print(render.text("  " + _impact_line(impact), "dim"))
        _print_findings(findings, page)
        page.print()

    clean_flows = [i for i in report.flows if not i.findings]
    if clean_flows:
        page.print(render.text(
            f"{len(clean_flows)} flow(s) without findings: " + ", ".join(i.flow_slug for i in clean_flows),
            "dim"))
        page.print()

    _render_summary(report, fail_on, page)


def _print_findings(findings: Sequence[audit_op.Finding], page: render.Page) -> None:
    """One headline per finding, then its message and fix wrapped under it (readable at 80 columns)."""
    for f in findings:
        headline = Text("  ")
        headline.append_text(render.text(f.severity.upper() + (" (blocking)" if f.blocking else ""),
                                         SEVERITY_STYLE.get(f.severity)))
        headline.append("  ")
        headline.append_text(render.text(f.check_id, "bold"))
        headline.append("  ")
        headline.append_text(render.text(f.object_type + " "))
        headline.append_text(render.text(f.object_name, "bold"))
        if f.step_slug is not None and f.object_type != "step":
            headline.append_text(render.text(f" (step {f.step_slug})", "dim"))
        if f.reasons:
            headline.append_text(render.text("  [" + ", ".join(f.reasons) + "]", "dim"))
        page.print(headline)
        page.print(Padding(render.text(f.message), (0, 0, 0, 6)))
        suggested = f.evidence.get("suggested_slug") if isinstance(f.evidence, dict) else None
        if suggested:
            page.print(Padding(Text.assemble(("suggested slug: ", "bold"), render.text(suggested)), (0, 0, 0, 6)))
        page.print(Padding(Text.assemble(("fix: ", "bold"), render.text(f.fix)), (0, 0, 0, 6)))


def _impact_line(impact: audit_op.FlowImpact) -> str:
    parts = [
        f"{impact.steps} step(s)",
        f"runs: {impact.active_runs} active of {impact.total_runs}",
        f"tasks: {impact.queued_tasks} queued, {impact.started_tasks} started",
    ]
    queues = ", ".join(impact.queue_names) or "-"
    if impact.queue_backlog is None:
        backlog = "backlog unknown"
    else:
        approx = "" if impact.backlog_exact else "~"
        backlog = f"backlog {approx}{impact.queue_backlog} message(s)"
        if impact.oldest_message_age_seconds is not None:
            backlog += f", oldest {render.span(impact.oldest_message_age_seconds)}"
    parts.append(f"queue {queues}: {backlog}")
    if impact.queues_missing:
        parts.append(f"{impact.queues_missing} queue table(s) missing")
    if impact.queues_unreadable:
        parts.append(f"{impact.queues_unreadable} queue table(s) not readable")
    rows = f"rows {render.UNKNOWN}" if impact.archive_rows_estimate is None else f"~{impact.archive_rows_estimate} rows"
    size = "-" if impact.archive_bytes is None else render.size(impact.archive_bytes)
    parts.append(f"archive {rows}, {size}")
    if impact.shares_queue_with:
        parts.append("shares its queue with " + ", ".join(impact.shares_queue_with))
    return " · ".join(parts)


def _render_summary(report: audit_op.AuditReport, fail_on: str, page: render.Page) -> None:
    s = report.summary
    rows = []
    for severity in audit_op.SEVERITIES:
        count = {"error": s.errors, "warning": s.warnings, "info": s.info}[severity]
        blocking = sum(1 for f in report.findings if f.severity == severity and f.blocking)
        rows.append({"severity": severity, "findings": count, "blocking": blocking})
    page.table(SUMMARY_COLUMNS, rows, title="summary",
               style=lambda key, row: SEVERITY_STYLE[row["severity"]] if key == "severity" and row["findings"] else None)
    checks = ", ".join(f"{check_id} {count}" for check_id, count in s.by_check.items() if count)
    if checks:
        page.print(render.text(f"by check: {checks}", "dim"))
    page.print(render.text(f"{s.flows} flow(s) audited, {s.flows_with_findings} with findings"))
    failing = report.failing(fail_on)
    if failing:
        page.print(render.text(f"exit 1: {len(failing)} finding(s) at or above --fail-on {fail_on}", "bold"))
    style = "bold red" if s.blocking else ("yellow" if (s.errors or s.warnings) else "bold green")
    page.line(common.with_target("next: " + report.next_step()), style)


def _installed(schema: audit_op.SchemaInfo) -> str:
    """Who installed the schema: ``pgflow schema installed by pgflow 0.8.0/0.8.1/0.9.0/0.9.1 (...)``
    when recognised from the catalog, else ``pgflow installed by pgflow-cli``."""
    recognition = schema.recognition or {}
    if recognition.get("status") in ("upstream", "unrecognised", "adopted"):
        return f"pgflow schema {recognition['summary']}"
    return f"pgflow installed by {schema.installed_by}"

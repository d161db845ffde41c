"""What ``migrate apply`` would do here and what can be run next (``migrate plan``), and the
preflight audit both run first."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgflow_cli import installer
from pgflow_cli.errors import PgflowError, Refused
from pgflow_cli.operations import upstream
from pgflow_cli.operations.migrate.verdict import blocking_conflict, summary


@dataclass
class PlanReport:
    """What ``migrate apply`` would do here, and what can be run next (``migrate plan``).

    Attributes:
        plan: the installer's comparison of files and ledger.
        found: what installed the schema and what adopting it involves.
        conflict: what stops ``apply`` (exit 6), or ``None``.
        refused: the preflight audit's refusal (exit 1), or ``None``.
        pending: one dict per migration apply runs: ``version``, ``name``, ``summary``, ``checksum``,
            ``state``, ``path`` (one transaction / phased, in words), ``preflight_audit`` (bool),
            ``worker_protocol`` (int or None).
        pgmq_installed: ``pgmq.meta`` exists.
        next: commands that will succeed in this state (without the target option; the CLI adds
            it), e.g. ``pgflow migrate apply --dry-run``: in order, or alternatives when ``choice``.
        notes: sentences to show with them.
        choice: ``next`` lists alternatives (resume or abort), not steps.
    """

    plan: installer.Plan
    found: upstream.UpstreamPlan
    conflict: PgflowError | None
    refused: PgflowError | None
    pending: list[dict[str, Any]]
    pgmq_installed: bool
    next: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    choice: bool = False

    @property
    def problem(self) -> PgflowError | None:
        """The conflict or the refusal (what the command exits with), or ``None``."""
        return self.conflict or self.refused

    def to_dict(self) -> dict[str, Any]:
        return {
            "upstream": self.found.to_dict(),
            "pending": self.pending,
            "pgmq_installed": self.pgmq_installed,
            "conflict": self.conflict.to_dict() if self.conflict else None,
            "refused": self.refused.to_dict() if self.refused else None,
            "next": self.next,
            "next_is_choice": self.choice,
            "notes": self.notes,
        }


def make_plan(conn: psycopg.Connection, *, assume_release: str | None = None) -> PlanReport:
    """Plan ``migrate apply`` (read-only): the pending migrations and their paths, the preflight audit,
    and the commands that will succeed next in this state.

    The suggestions follow the state: a conflict or a refusal suggests nothing that would fail (the
    audit for a refusal); a migration in progress suggests resuming or aborting it (a dry run cannot
    replay it); a database without PGMQ suggests installing it (``--install-pgmq``, which cannot be
    combined with ``--dry-run``); otherwise a dry run, then the apply.

    Returns:
        A :class:`PlanReport`.
    """
    the_plan = installer.make_plan(conn)
    found = upstream.inspect(conn, assume_release=assume_release)
    conflict = blocking_conflict(the_plan, found)
    upstream_schema = found.recognition.status in ("upstream", "unrecognised")
    todo = [m for m in the_plan.pending if not (upstream_schema and m.version <= installer.BASELINE_VERSION)]
    refused: PgflowError | None = None
    if not conflict:
        try:
            preflight(conn, [m for m in todo if not the_plan.converts(m)])
        except Refused as exc:
            refused = exc
    states = {s.version: s.state for s in the_plan.statuses if s.state != "superseded"}
    pending = [{"version": m.version, "name": m.name, "summary": summary(m), "checksum": m.checksum,
                "state": states.get(m.version, "pending"), "path": _path(conn, the_plan, m),
                "preflight_audit": m.preflight_audit and not the_plan.converts(m),
                "worker_protocol": None if the_plan.converts(m) else m.worker_protocol}
               for m in todo]
    report = PlanReport(the_plan, found, conflict, refused, pending, the_plan.state.has_pgmq_meta)
    work = bool(pending or found.steps)
    in_progress = [p for p in pending if p["state"] == "in_progress"]
    if conflict:
        pass
    elif refused:
        report.next = ["pgflow audit"]
        report.notes.append("fix the blocking findings `pgflow audit` lists, then plan again")
    elif in_progress:
        version = in_progress[0]["version"]
        report.next = ["pgflow migrate apply", f"pgflow migrate abort {version}"]
        report.choice = True
        report.notes.append(f"{version:04d} is in progress: `apply` resumes it after its last committed phase, "
                            "`abort` undoes its committed phases (a dry run cannot replay a partly applied migration)")
    elif work and not report.pgmq_installed:
        report.next = ["pgflow migrate apply --install-pgmq"]
        report.notes.append("PGMQ is not installed: install the pgmq extension (CREATE EXTENSION pgmq) and plan "
                            "again, or let apply install the PGMQ SQL bundled with pgflow-cli (--install-pgmq; "
                            "a dry run needs PGMQ first)")
    elif work:
        report.next = ["pgflow migrate apply --dry-run", "pgflow migrate apply"]
    return report


def _path(conn: psycopg.Connection, plan: installer.Plan, migration: installer.Migration) -> str:
    """How ``apply`` runs ``migration`` here, in words (``migrate plan``)."""
    if plan.converts(migration):
        return (f"conversion of 0003-0016 of pgflow-cli {installer.old_levels.OLD_BUILD} (one transaction: a catalog "
                "comparison, then the stage's later columns and tables, functions and grants; no table scanned "
                "or rewritten)")
    return migration.phased.path(conn) if migration.phased else "one transaction"


@dataclass(frozen=True)
class Preflight:
    """The preflight audit passed: ``findings`` in all, ``blocking`` (0), in ``seconds``."""

    findings: int
    blocking: int
    seconds: float


def preflight(conn: psycopg.Connection, pending: list[installer.Migration]) -> Preflight | None:
    """Run the audit's blocking rules before any lock when a pending migration asks for it.

    Returns:
        What it found (or ``None`` when no pending migration asks for it, or on a fresh install).

    Raises:
        Refused: blocking findings exist (exit 1), with every one of them in the detail; nothing
            was locked or changed.
    """
    if not any(m.preflight_audit for m in pending):
        return None
    if not installer.read_state(conn).has_flows_table:
        return None  # a fresh install: no definition exists yet, nothing to audit
    from pgflow_cli.operations.audit import run_audit

    started = time.monotonic()
    report = run_audit(conn)
    blocking = report.blocking
    if blocking:
        raise Refused(
            f"the upgrade is refused: {len(blocking)} blocking finding(s); nothing was locked or changed",
            hint="run `pgflow audit` for the full report and the fix of each finding: a rejected name needs a new "
            "concrete flow under a compliant slug; pgflow never renames or deletes flows",
            detail=[f"{f.check_id}: {f.object_type} {f.object_name}"
                    + (f" (flow {f.flow_slug})" if f.flow_slug and f.flow_slug != f.object_name else "")
                    + f": {f.message}" for f in blocking],
        )
    return Preflight(len(report.findings), 0, time.monotonic() - started)

"""``pgflow audit``: the read-only pre-upgrade report (docs/audit.md).

The report is three set-based statements from ``sql/audit.sql``, run in one
``REPEATABLE READ, READ ONLY`` transaction (one snapshot, no writes, nothing created):

``schema_probe``
    catalog only: which pgflow tables and columns exist, PGMQ and its version, privileges;
``findings``
    every finding (``sql/audit/findings.sql``, the fragment the queue-identity migration
    reruns under its locks);
``flow_impact``
    per flow: runs, tasks, queue backlog, archive size (catalog estimates).

SQL is authoritative; this module only turns rows into dataclasses, applies the ``--flow``
filter, counts, and builds the versioned JSON document. The same SQL ships as one psql file
(:func:`psql_script`, ``sql/dist/pgflow_audit.sql``).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgflow_cli import __version__, sqlfiles
from pgflow_cli.db import transaction
from pgflow_cli.errors import ConnectionFailed, SchemaMissing, StateConflict
from pgflow_cli.operations import names

AUDIT_SQL = "audit.sql"
"""The named statements, below ``sql/``."""

DIST_SQL = "dist/pgflow_audit.sql"
"""The generated psql file, below ``sql/`` (checked in; a test keeps it in sync)."""

STATEMENTS = ("schema_probe", "findings", "flow_impact")
"""The report's statements, in order. Besides them the transaction sends only settings:
``SET TRANSACTION``, the timeouts, and ``jit = off`` (section ``session_settings``)."""

DOCUMENT_KIND = "pgflow-cli/audit"
DOCUMENT_VERSION = 1
"""JSON document identity; bump the version on any incompatible change (docs/audit.md)."""

SEVERITIES = ("error", "warning", "info")
"""Severities from most to least serious."""

FAIL_ON = ("error", "warning", "never")
"""Values of ``--fail-on``: the lowest severity that makes the audit exit 1."""


def _json_fields(record: Any) -> dict[str, Any]:
    """A dataclass instance's fields by name, in declaration order, for a JSON document: tuples
    become lists and dicts are copied (one level); other values are kept as they are.

    Args:
        record: a dataclass instance (a report row).
    """
    def plain(value: Any) -> Any:
        return list(value) if isinstance(value, tuple) else dict(value) if isinstance(value, dict) else value

    return {item.name: plain(getattr(record, item.name)) for item in dataclasses.fields(record)}


@dataclass(frozen=True)
class CheckInfo:
    """Static description of one check (the SQL decides; this mirrors it for docs and tests).

    Attributes:
        check_id: stable id.
        severity: ``error``, ``warning`` or ``info``: the highest severity the check reports.
        blocking: the queue-identity migration refuses while such a finding exists.
        title: a short description.
        lower_severities: severities the check may report instead, depending on the evidence.
        in_sql: the SQL of sql/audit/findings.sql reports it (False: the tool alone, in Python).
    """

    check_id: str
    severity: str
    blocking: bool
    title: str
    lower_severities: tuple[str, ...] = ()
    in_sql: bool = True

    @property
    def severities(self) -> tuple[str, ...]:
        """Every severity this check may report."""
        return (self.severity,) + self.lower_severities


CHECKS: dict[str, CheckInfo] = {
    c.check_id: c
    for c in (
        CheckInfo("flow_slug_rejected", "error", True, "flow slug rejected by the new slug rules"),
        CheckInfo("step_slug_rejected", "error", True, "step slug rejected by the new slug rules"),
        CheckInfo("flow_slug_case_conflict", "error", True, "flow slugs equal ignoring case"),
        CheckInfo("step_slug_case_conflict", "error", True, "step slugs equal ignoring case within a flow"),
        CheckInfo("queue_alias_conflict", "error", True, "several pgmq.meta rows for the same physical tables"),
        CheckInfo("flow_queue_name_too_long", "error", True, "a flow's queue name exceeds PGMQ's limits"),
        CheckInfo("task_message_id_duplicate", "error", True, "a message id held by several tasks of one queue"),
        CheckInfo("queue_name_too_long", "error", False, "an existing queue's name exceeds PGMQ's limits"),
        CheckInfo("flow_queue_missing", "error", True, "a flow's PGMQ queue has no queue table or no archive table"),
        CheckInfo("flow_queue_table_elsewhere", "error", True,
                  "a flow's queue tables are not where its routed queue name leads (locale-dependent lowercasing)"),
        CheckInfo("flow_queue_meta_missing", "warning", False, "a flow's PGMQ queue has its tables but no pgmq.meta row"),
        CheckInfo("queue_meta_spelling", "warning", False, "a flow's pgmq.meta row is not spelled lowercase / as the flow",
                  ("info",)),
        CheckInfo("step_queue_collision", "warning", False, "an existing queue has a name a flow would generate"),
        CheckInfo("queue_unowned", "info", False, "a queue no flow owns"),
        CheckInfo("step_queues_unavailable", "info", False, "a flow whose private step queue names cannot be generated"),
        CheckInfo("runtime_schema_broken", "error", True,
                  "a table, column, constraint, index or trigger the runtime needs is missing or changed",
                  in_sql=False),
    )
}
"""Every check id the SQL can produce."""

REQUIRED_TABLES: dict[str, tuple[str, ...]] = {
    "flows": ("flow_slug",),
    "steps": ("flow_slug", "step_slug", "step_index"),
    "runs": ("flow_slug", "status"),
    "step_states": ("run_id", "step_slug"),
    "step_tasks": ("flow_slug", "status", "message_id"),
}
"""Tables (and columns) without which a schema named ``pgflow`` is not a pgflow schema."""

READ_TABLES = ("flows", "steps", "runs", "step_tasks")
"""pgflow tables the audit reads (it needs SELECT on these)."""


# --------------------------------------------------------------------------------------------
# result types
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SchemaInfo:
    """What the catalog probe found.

    Attributes:
        database: database name.
        role: the role the audit ran as.
        server_version: PostgreSQL's version string (``15.8 (Debian ...)``).
        server_version_num: e.g. ``150008``.
        audited_at: ISO 8601 timestamp of the audit's snapshot (server clock).
        pgflow_tables: ``{table: [columns]}`` of every table in schema ``pgflow``.
        ledger: ``pgflow.schema_migrations`` exists (installed by pgflow-cli).
        queue_identity: ``steps.queue_name`` exists (queue-identity schema).
        step_queues: ``flows.queue_mode`` exists (private step queue schema).
        pgmq_version: PGMQ version, or ``None`` when unknown.
        pgmq_version_source: ``"extension"``, ``"schema comment"`` or ``None``.
        pgmq_message_headers: ``pgmq.message_record`` has ``headers`` (PGMQ 1.5+).
        pgmq_queue_tables: number of ``pgmq.q_*`` tables.
        pgmq_unreadable_tables: ``q_``/``a_`` tables the role may not read.
        notes: what the audit could and could not check, one sentence each.
        recognition: what installed the schema (:meth:`pgflow_cli.upstream.recognise.Recognition.to_dict`:
            status, releases, summary, differences ...), read from the catalog.
    """

    database: str
    role: str
    server_version: str
    server_version_num: int
    audited_at: str
    pgflow_tables: dict[str, list[str]]
    ledger: bool
    queue_identity: bool
    step_queues: bool
    pgmq_version: str | None
    pgmq_version_source: str | None
    pgmq_message_headers: bool
    pgmq_queue_tables: int
    pgmq_unreadable_tables: int
    notes: list[str] = field(default_factory=list)
    recognition: dict[str, Any] | None = None

    @property
    def installed_by(self) -> str:
        """``"pgflow-cli"`` when the ledger exists, else ``"upstream"`` (an npm/Supabase install)."""
        return "pgflow-cli" if self.ledger else "upstream"

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``database`` object of the document)."""
        return {
            "name": self.database,
            "role": self.role,
            "server_version": self.server_version,
            "server_version_num": self.server_version_num,
            "audited_at": self.audited_at,
            "pgflow": {
                "installed_by": self.installed_by,
                "ledger": self.ledger,
                "queue_identity": self.queue_identity,
                "step_queues": self.step_queues,
                "tables": self.pgflow_tables,
                "recognition": self.recognition,
            },
            "pgmq": {
                "version": self.pgmq_version,
                "version_source": self.pgmq_version_source,
                "message_headers": self.pgmq_message_headers,
                "queue_tables": self.pgmq_queue_tables,
                "unreadable_tables": self.pgmq_unreadable_tables,
            },
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class Finding:
    """One finding row (columns of ``sql/audit/findings.sql``).

    Attributes:
        check_id: stable id (:data:`CHECKS`).
        severity: ``error``, ``warning`` or ``info``.
        blocking: the queue-identity migration refuses while it exists.
        flow_slug: the flow concerned, or ``None`` for queues no flow owns.
        step_slug: the step concerned, if any.
        object_type: ``flow``, ``step`` or ``queue``.
        object_name: the flow slug, step slug or queue name, spelled as stored.
        reasons: stable reason codes, every one that applies, in a fixed order.
        evidence: check-specific facts; ``related_flows`` lists every flow involved.
        message: one sentence for people.
        fix: what to do.
    """

    check_id: str
    severity: str
    blocking: bool
    flow_slug: str | None
    step_slug: str | None
    object_type: str
    object_name: str
    reasons: tuple[str, ...]
    evidence: dict[str, Any]
    message: str
    fix: str

    @property
    def related_flows(self) -> frozenset[str]:
        """Every flow the finding touches (its own and, e.g., the rest of a case group)."""
        flows = {str(slug) for slug in self.evidence.get("related_flows") or ()}
        if self.flow_slug is not None:
            flows.add(self.flow_slug)
        return frozenset(flows)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (one element of ``findings``)."""
        return _json_fields(self)


@dataclass(frozen=True)
class FlowImpact:
    """Data at stake for one flow.

    Attributes:
        flow_slug: the flow.
        queue_mode: ``flow`` (one default queue) or ``step`` (private step queues).
        steps: number of steps.
        total_runs: runs of any status.
        active_runs: runs with status ``started``.
        queued_tasks: tasks with status ``queued``.
        started_tasks: tasks with status ``started`` (claimed by a worker).
        queue_names: the queues the flow uses (lowercase names).
        queues_missing: how many of them have no queue table.
        queues_unreadable: how many queue tables the role may not read (backlog unknown).
        queue_backlog: messages in the queue tables (visible or not); ``None`` if unknown.
            A queue shared with other flows (see ``shares_queue_with``) counts theirs too.
        backlog_exact: ``True`` when counted; ``False`` when the flows use more queue tables
            than the audit's lock budget (4 x ``max_locks_per_transaction``) and the backlog
            is the activity statistics' live-row estimate (oldest age then unknown).
        oldest_message_age_seconds: age of the oldest message, seconds; ``None`` when empty.
        archive_rows_estimate: archived messages per the planner's statistics
            (``pg_class.reltuples``); ``None`` before the first ANALYZE.
        archive_bytes: estimated size of the archive tables incl. indexes and TOAST, bytes: the
            pages ``pg_class.relpages`` records (as of the last VACUUM, ANALYZE or index build)
            times the block size; the audit never opens an archive table.
        shares_queue_with: other flows whose queue maps to the same physical tables.
        findings: number of findings touching this flow (after filtering).
    """

    flow_slug: str
    queue_mode: str
    steps: int
    total_runs: int
    active_runs: int
    queued_tasks: int
    started_tasks: int
    queue_names: tuple[str, ...]
    queues_missing: int
    queues_unreadable: int
    queue_backlog: int | None
    backlog_exact: bool
    oldest_message_age_seconds: float | None
    archive_rows_estimate: int | None
    archive_bytes: int | None
    shares_queue_with: tuple[str, ...]
    findings: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON form (one element of ``flows``)."""
        return _json_fields(self)


@dataclass(frozen=True)
class Summary:
    """Counts over the (filtered) findings.

    Attributes:
        errors / warnings / info: findings per severity.
        blocking: findings that make the queue-identity migration refuse.
        flows: flows in the report (all, or those the filter selected).
        flows_with_findings: flows touched by at least one finding.
        by_check: ``{check_id: count}`` for every check id (zeros included).
    """

    errors: int
    warnings: int
    info: int
    blocking: int
    flows: int
    flows_with_findings: int
    by_check: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the ``summary`` object)."""
        return _json_fields(self)


@dataclass(frozen=True)
class AuditReport:
    """The whole report.

    Attributes:
        schema: what the probe found.
        findings: findings in report order (severity, flow, check, step, object).
        flows: per-flow impact, ordered by flow slug.
        summary: counts.
        flow_filter: the ``--flow`` values, or ``None`` for the whole database.
        duration_ms: wall time of the transaction, milliseconds.
        statements: statements the audit sent inside its transaction (besides BEGIN/SET).
    """

    schema: SchemaInfo
    findings: list[Finding]
    flows: list[FlowImpact]
    summary: Summary
    flow_filter: tuple[str, ...] | None = None
    duration_ms: int = 0
    statements: int = len(STATEMENTS)
    blocking_elsewhere: tuple[str, ...] = ()
    """With ``--flow``: the flows (or ``queue <name>``) of blocking findings left out by the filter,
    which still make ``pgflow migrate`` refuse."""

    @property
    def blocking(self) -> list[Finding]:
        """Findings that make the queue-identity migration refuse."""
        return [f for f in self.findings if f.blocking]

    def failing(self, fail_on: str = "warning") -> list[Finding]:
        """Findings at or above ``fail_on`` (``error``, ``warning``; ``never`` gives none)."""
        if fail_on not in FAIL_ON:
            raise ValueError(f"fail_on must be one of {FAIL_ON}, got {fail_on!r}")
        if fail_on == "never":
            return []
        wanted = ("error",) if fail_on == "error" else ("error", "warning")
        return [f for f in self.findings if f.severity in wanted]

    def exit_code(self, fail_on: str = "warning") -> int:
        """0 when nothing at or above ``fail_on`` was found, else 1 (info never fails)."""
        return 1 if self.failing(fail_on) else 0

    def next_step(self) -> str:
        """The next thing the operator should do, one sentence, from what was actually found."""
        blocking = {f.check_id for f in self.blocking}
        if blocking:
            todo = []
            if blocking & {"flow_slug_rejected", "step_slug_rejected", "flow_slug_case_conflict", "step_slug_case_conflict"}:
                todo.append("replace each rejected or case-conflicting definition by a new concrete flow under a "
                            "compliant slug and delete the old one once its runs finished")
            if "queue_alias_conflict" in blocking:
                todo.append("remove the surplus pgmq.meta spelling named in each queue_alias_conflict finding")
            if "task_message_id_duplicate" in blocking:
                todo.append("delete the finished runs that hold duplicated message ids")
            if "flow_queue_name_too_long" in blocking:
                todo.append("replace each flow whose queue name is too long by one with a shorter slug")
            return (f"fix the {self.summary.blocking} blocking finding(s): " + "; ".join(todo)
                    + " (docs/audit.md, docs/upgrade.md step 1); then run `pgflow audit` again. "
                    "`pgflow migrate` refuses until they are gone")
        if self.flow_filter:
            selected = ", ".join(self.flow_filter)
            review = " (review the errors and warnings above)" if self.summary.errors or self.summary.warnings else ""
            if self.blocking_elsewhere:
                return (f"nothing to fix in {selected}{review}; but blocking findings elsewhere "
                        f"({', '.join(self.blocking_elsewhere)}) still make `pgflow migrate` refuse: "
                        "run `pgflow audit` without --flow for them")
            if self.schema.queue_identity:
                return f"nothing to fix in {selected}{review}; this database already has queue identity"
            return f"nothing to fix in {selected}{review}; nothing blocks elsewhere: run `pgflow migrate plan`"
        if self.schema.queue_identity:
            return "this database already has queue identity: nothing blocks, nothing to upgrade for this release"
        if self.summary.errors or self.summary.warnings:
            return (
                "nothing blocks the upgrade: review the errors and warnings above (docs/audit.md), "
                "then run `pgflow migrate plan`"
            )
        return "nothing to fix: run `pgflow migrate plan`"

    def to_document(self, fail_on: str = "warning") -> dict[str, Any]:
        """The versioned JSON document (docs/audit.md "JSON format")."""
        return {
            "kind": DOCUMENT_KIND,
            "version": DOCUMENT_VERSION,
            "tool_version": __version__,
            "database": self.schema.to_dict(),
            "filter": {"flows": list(self.flow_filter) if self.flow_filter is not None else None},
            "fail_on": fail_on,
            "summary": {
                **self.summary.to_dict(),
                "exit_code": self.exit_code(fail_on),
                "next": self.next_step(),
                "blocking_elsewhere": list(self.blocking_elsewhere),
            },
            "findings": [f.to_dict() for f in self.findings],
            "flows": [f.to_dict() for f in self.flows],
            "timing": {"duration_ms": self.duration_ms, "statements": self.statements},
        }


# --------------------------------------------------------------------------------------------
# running it
# --------------------------------------------------------------------------------------------


def run_audit(
    conn: psycopg.Connection,
    flow_filter: Iterable[str] | None = None,
    *,
    statement_timeout: float | None = 120.0,
    lock_timeout: float | None = 5.0,
) -> AuditReport:
    """Audit the database behind ``conn`` (read-only) and return the report.

    Args:
        conn: an autocommit connection (:func:`pgflow_cli.db.connect`); the audit opens and
            ends its own ``REPEATABLE READ, READ ONLY`` transaction on it.
        flow_filter: exact flow slugs to report on; ``None`` or empty for every flow.
            A finding is kept when it touches one of them (a case-conflict group with a
            selected member is kept whole). Queue findings that touch no flow are dropped.
        statement_timeout: seconds each statement may run (``None``: no limit).
        lock_timeout: seconds to wait for a lock (the audit takes only ACCESS SHARE locks,
            which wait only behind DDL such as a running migration).

    Returns:
        The :class:`AuditReport`.

    Raises:
        SchemaMissing: no pgflow schema, a schema ``pgflow`` without pgflow's tables, or no
            PGMQ (exit 3).
        ConnectionFailed: the role lacks USAGE/SELECT the audit needs (exit 3).
        StateConflict: a ``--flow`` value names no flow (exit 6).
        psycopg.Error: anything else from the server (the CLI maps it).
    """
    wanted = tuple(dict.fromkeys(flow_filter)) if flow_filter else None
    started = time.monotonic()
    with transaction(
        conn,
        read_only=True,
        isolation="repeatable read",
        statement_timeout=statement_timeout,
        lock_timeout=lock_timeout,
    ):
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(sqlfiles.statement(AUDIT_SQL, "session_settings"))
            cur.execute(sqlfiles.statement(AUDIT_SQL, "schema_probe"))
            probe = cur.fetchone()
            assert probe is not None
            schema = _with_recognition(conn, schema_from_probe(probe))
            cur.execute(sqlfiles.statement(AUDIT_SQL, "findings"))
            finding_rows = cur.fetchall()
            broken = _runtime_schema_findings(conn)
            cur.execute(sqlfiles.statement(AUDIT_SQL, "flow_impact"))
            impact_rows = cur.fetchall()
    duration_ms = int((time.monotonic() - started) * 1000)
    findings = broken + [finding_from_row(row) for row in finding_rows]
    impacts = [impact_from_row(row) for row in impact_rows]
    if not all(impact.backlog_exact for impact in impacts):
        schema.notes.append(
            "the flows use more PGMQ queue tables than the audit locks at once (4 x max_locks_per_transaction): "
            "queue backlogs are live-row estimates from the activity statistics, oldest message ages unknown"
        )
    return build_report(schema, findings, impacts, wanted, duration_ms=duration_ms)


def _runtime_schema_findings(conn: psycopg.Connection) -> list[Finding]:
    """One ``runtime_schema_broken`` finding per object the runtime needs and the schema lacks or has
    changed (:func:`pgflow_cli.operations.schema.database_breaks`: catalog reads only). Computed here,
    not in sql/audit.sql: the expected shapes ship with the tool, so the psql file cannot make it."""
    from pgflow_cli.installer import shapes
    from pgflow_cli.operations import schema

    findings = []
    for difference in schema.database_breaks(conn):
        table = difference.name.split(".", 1)[0] if difference.kind in ("column", "constraint", "trigger") else None
        findings.append(Finding(
            check_id="runtime_schema_broken", severity="error", blocking=True, flow_slug=None, step_slug=None,
            object_type=difference.kind, object_name=difference.name, reasons=(f"{difference.change}_{difference.kind}",),
            evidence={"change": difference.change, "expected": difference.expected, "found": difference.found,
                      **({"table": table} if table else {})},
            message=shapes.describe(difference),
            fix="restore it as the installer created it (from a backup or the migration that made it); "
                "see docs/upgrade.md \"A broken runtime schema\""))
    return findings


def _with_recognition(conn: psycopg.Connection, schema: SchemaInfo) -> SchemaInfo:
    """``schema`` naming the release that installed it (one catalog query), also in its first note."""
    from pgflow_cli.upstream.recognise import recognise

    found = recognise(conn)
    notes = list(schema.notes)
    if not schema.ledger or found.status == "adopted":
        notes[0] = found.summary() + (
            "" if schema.ledger else ": `pgflow migrate plan` shows how it is adopted (docs/upgrade.md)")
    return dataclasses.replace(schema, recognition=found.to_dict(), notes=notes)


def schema_from_probe(probe: dict[str, Any]) -> SchemaInfo:
    """Turn the ``schema_probe`` row into :class:`SchemaInfo`, refusing what cannot be audited.

    Raises:
        SchemaMissing: no pgflow schema, not a pgflow schema, or no PGMQ (exit 3).
        ConnectionFailed: missing USAGE or SELECT privileges (exit 3).
    """
    database = probe["database_name"]
    role = probe["role_name"]
    grant_hint = (
        f"grant the read-only privileges the audit needs: GRANT USAGE ON SCHEMA pgflow, pgmq TO {role}; "
        f"GRANT SELECT ON ALL TABLES IN SCHEMA pgflow, pgmq TO {role}; (docs/audit.md)"
    )
    if not probe["has_pgflow_schema"]:
        raise SchemaMissing(
            f"database {database!r} has no pgflow schema: there is nothing to audit",
            hint="connect to the database that holds pgflow (--dsn, PGFLOW_DATABASE_URL, DATABASE_URL, PG* variables); "
            "a new database needs no audit: install pgflow with `pgflow migrate apply`",
            reason="schema_missing",
        )
    if not probe["pgflow_usage"]:
        raise ConnectionFailed(f"role {role!r} has no USAGE privilege on schema pgflow", hint=grant_hint)
    tables: dict[str, dict[str, Any]] = probe["pgflow_tables"] or {}
    missing = [name for name in REQUIRED_TABLES if name not in tables]
    lacking_columns = [
        f"{name}.{column}"
        for name, columns in REQUIRED_TABLES.items()
        if name in tables
        for column in columns
        if column not in tables[name]["columns"]
    ]
    if missing or lacking_columns:
        detail = []
        if missing:
            detail.append("missing tables: " + ", ".join(f"pgflow.{name}" for name in missing))
        if lacking_columns:
            detail.append("missing columns: " + ", ".join(f"pgflow.{col}" for col in lacking_columns))
        raise SchemaMissing(
            f"schema pgflow in database {database!r} is not a pgflow schema",
            hint="this schema holds something else under the name pgflow; connect to the database where pgflow "
            "is installed",
            detail=detail,
        )
    if not probe["has_pgmq_schema"] or not probe["has_pgmq_meta"]:
        raise SchemaMissing(
            f"PGMQ is not installed in database {database!r} (no pgmq.meta table), so pgflow cannot run here",
            hint="pgflow needs the pgmq extension (CREATE EXTENSION pgmq); check that this is the right database",
        )
    unreadable = [f"pgflow.{name}" for name in READ_TABLES if not tables[name]["select"]]
    if not probe["pgmq_usage"]:
        unreadable.insert(0, "schema pgmq (USAGE)")
    if not probe["pgmq_meta_select"]:
        unreadable.append("pgmq.meta")
    if unreadable:
        raise ConnectionFailed(
            f"role {role!r} may not read what the audit needs: " + ", ".join(unreadable),
            hint=grant_hint,
        )

    columns = {name: list(info["columns"]) for name, info in sorted(tables.items())}
    ledger = "schema_migrations" in tables
    queue_identity = "queue_name" in columns.get("steps", [])
    step_queues = "queue_mode" in columns.get("flows", [])
    extension_version = probe["pgmq_extension_version"]
    comment_version = _version_from_comment(probe["pgmq_schema_comment"])
    pgmq_version = extension_version or comment_version
    source = "extension" if extension_version else ("schema comment" if comment_version else None)

    notes: list[str] = []
    if ledger:
        notes.append("installed by pgflow-cli (pgflow.schema_migrations exists)")
    else:
        notes.append("installed without pgflow-cli (no pgflow.schema_migrations): an upstream pgflow installation")
    if queue_identity:
        notes.append(
            "queue identity present (steps.queue_name): persisted routes were checked; duplicate message ids "
            "were not, the schema enforces them"
        )
    else:
        notes.append(
            "pre-upgrade schema (no steps.queue_name): each flow's queue was taken as lower(flow_slug), "
            "the name the upgrade will persist"
        )
    if not step_queues:
        notes.append("private step queues are not installed (no flows.queue_mode): step queue names are a forecast")
    if pgmq_version is None:
        notes.append("PGMQ version unknown (no pgmq extension and no version comment on schema pgmq)")
    if not probe["pgmq_message_headers"]:
        notes.append("pgmq.message_record has no headers column: PGMQ is older than 1.5, which pgflow 0.8+ needs")
    if probe["pgmq_unreadable_tables"]:
        notes.append(
            f"{probe['pgmq_unreadable_tables']} PGMQ queue/archive table(s) are not readable by role {role!r}: "
            "their backlog is reported as unknown"
        )
    notes.append("archive row counts and sizes are catalog estimates (pg_class.reltuples, relpages) as of the last "
                 "VACUUM or ANALYZE; row counts are unknown until a table is analyzed")

    audited_at: object = probe.get("audited_at")
    return SchemaInfo(
        database=database,
        role=role,
        server_version=probe["server_version"],
        server_version_num=int(probe["server_version_num"]),
        audited_at=audited_at.isoformat() if hasattr(audited_at, "isoformat") else str(audited_at),
        pgflow_tables=columns,
        ledger=ledger,
        queue_identity=queue_identity,
        step_queues=step_queues,
        pgmq_version=pgmq_version,
        pgmq_version_source=source,
        pgmq_message_headers=bool(probe["pgmq_message_headers"]),
        pgmq_queue_tables=int(probe["pgmq_queue_tables"] or 0),
        pgmq_unreadable_tables=int(probe["pgmq_unreadable_tables"] or 0),
        notes=notes,
    )


_COMMENT_VERSION = re.compile(r"\bPGMQ\s+v?(\d+(?:\.\d+)+)")


def _version_from_comment(comment: str | None) -> str | None:
    """Version from the comment pgflow-cli puts on a SQL-installed pgmq schema (``PGMQ 1.13.0 (...)``)."""
    match = _COMMENT_VERSION.search(comment or "")
    return match.group(1) if match else None


def finding_from_row(row: dict[str, Any]) -> Finding:
    """One ``findings`` row as a :class:`Finding`."""
    return Finding(
        check_id=row["check_id"],
        severity=row["severity"],
        blocking=bool(row["blocking"]),
        flow_slug=row["flow_slug"],
        step_slug=row["step_slug"],
        object_type=row["object_type"],
        object_name=row["object_name"],
        reasons=tuple(row["reasons"] or ()),
        evidence=dict(row["evidence"] or {}),
        message=row["message"],
        fix=row["fix"],
    )


def impact_from_row(row: dict[str, Any]) -> FlowImpact:
    """One ``flow_impact`` row as a :class:`FlowImpact`."""
    age = row["oldest_message_age_seconds"]
    return FlowImpact(
        flow_slug=row["flow_slug"],
        queue_mode=row["queue_mode"],
        steps=int(row["steps"]),
        total_runs=int(row["total_runs"]),
        active_runs=int(row["active_runs"]),
        queued_tasks=int(row["queued_tasks"]),
        started_tasks=int(row["started_tasks"]),
        queue_names=tuple(row["queue_names"] or ()),
        queues_missing=int(row["queues_missing"]),
        queues_unreadable=int(row["queues_unreadable"]),
        queue_backlog=_int_or_none(row["queue_backlog"]),
        backlog_exact=bool(row["backlog_exact"]),
        oldest_message_age_seconds=float(age) if isinstance(age, (Decimal, int, float)) else None,
        archive_rows_estimate=_int_or_none(row["archive_rows_estimate"]),
        archive_bytes=_int_or_none(row["archive_bytes"]),
        shares_queue_with=tuple(row["shares_queue_with"] or ()),
    )


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def build_report(
    schema: SchemaInfo,
    findings: Sequence[Finding],
    impacts: Sequence[FlowImpact],
    flow_filter: Sequence[str] | None,
    *,
    duration_ms: int = 0,
) -> AuditReport:
    """Apply the flow filter, attach finding counts to flows, and count.

    Raises:
        StateConflict: a filtered flow does not exist (exit 6), with case-insensitive
            suggestions.
    """
    known = {impact.flow_slug for impact in impacts}
    elsewhere: list[str] = []
    if flow_filter:
        unknown = [slug for slug in flow_filter if slug not in known]
        if unknown:
            detail = []
            for slug in unknown:
                similar = names.suggestions(slug, known)
                detail.append(f"{slug!r}" + (f": did you mean {' or '.join(repr(s) for s in similar)}?" if similar else ""))
            raise StateConflict(
                f"flow not found: {', '.join(repr(s) for s in unknown)}",
                hint="--flow takes an exact flow slug (case matters); run `pgflow audit` without --flow to see every flow",
                detail=detail,
            )
        selected = set(flow_filter)
        elsewhere = sorted({slug for f in findings if f.blocking and not f.related_flows & selected
                            for slug in (sorted(f.related_flows) or [f"{f.object_type} {f.object_name}"])})
        findings = [f for f in findings if f.related_flows & selected]
        shown = selected | {slug for f in findings for slug in f.related_flows}
        impacts = [impact for impact in impacts if impact.flow_slug in shown]

    per_flow: dict[str, int] = {}
    for finding in findings:
        for slug in finding.related_flows:
            per_flow[slug] = per_flow.get(slug, 0) + 1
    flows = [_with_count(impact, per_flow.get(impact.flow_slug, 0)) for impact in impacts]

    by_check = {check_id: 0 for check_id in CHECKS}
    for finding in findings:
        by_check[finding.check_id] = by_check.get(finding.check_id, 0) + 1
    summary = Summary(
        errors=sum(1 for f in findings if f.severity == "error"),
        warnings=sum(1 for f in findings if f.severity == "warning"),
        info=sum(1 for f in findings if f.severity == "info"),
        blocking=sum(1 for f in findings if f.blocking),
        flows=len(flows),
        flows_with_findings=sum(1 for impact in flows if impact.findings),
        by_check=by_check,
    )
    return AuditReport(
        schema=schema,
        findings=list(findings),
        flows=flows,
        summary=summary,
        flow_filter=tuple(flow_filter) if flow_filter else None,
        duration_ms=duration_ms,
        blocking_elsewhere=tuple(elsewhere),
    )


def _with_count(impact: FlowImpact, count: int) -> FlowImpact:
    from dataclasses import replace

    return replace(impact, findings=count)


# --------------------------------------------------------------------------------------------
# the psql file
# --------------------------------------------------------------------------------------------

_DIST_HEADER = """\
-- pgflow upgrade audit, for psql: a read-only report of every flow and step name the
-- queue-identity release rejects and every queue or data hazard (docs/audit.md).
--
--   psql "postgresql://user@host/dbname" -f pgflow_audit.sql
--
-- It runs inside BEGIN READ ONLY ... ROLLBACK, creates nothing, and needs only USAGE on the
-- schemas pgflow and pgmq and SELECT on their tables. Three result sets: the schema found,
-- the findings (blocking = true means the migration will refuse), the data at stake per flow.
--
-- GENERATED from sql/audit.sql by `pgflow audit --print-sql`; edit the source, not this file.

"""


def psql_script() -> str:
    """The complete psql file: ``sql/audit.sql`` with every include expanded, plus a header.

    ``sql/dist/pgflow_audit.sql`` holds exactly this text (a test compares them).
    """
    return _DIST_HEADER + _drop_leading_comment(sqlfiles.load(AUDIT_SQL))


def _drop_leading_comment(text: str) -> str:
    """Drop the source file's own leading comment block (the header replaces it)."""
    lines = text.splitlines(keepends=True)
    index = 0
    while index < len(lines) and lines[index].startswith("--"):
        index += 1
    return "".join(lines[index:])

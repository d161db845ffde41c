"""The ledger (``pgflow.schema_migrations``) and the plan: shipped migrations against a database.

Read-only: :func:`make_plan` compares the files with what a database recorded (and, at the newest
level, the installed functions with the function files); nothing here writes (the runner records
rows inside each migration's transaction).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgflow_cli import sqlfiles
from pgflow_cli.errors import StateConflict
from pgflow_cli.installer import old_levels
from pgflow_cli.installer.catalog import FunctionDrift, function_drift, function_files, optional_function_files
from pgflow_cli.installer.files import QUERIES, Migration, available_migrations


@dataclass(frozen=True)
class DatabaseState:
    """What a catalog probe found (no writes)."""

    has_pgflow_schema: bool
    has_ledger: bool
    has_flows_table: bool
    has_pgmq_schema: bool
    has_pgmq_meta: bool
    pgmq_extension_version: str | None
    pgmq_schema_comment: str | None
    server_version_num: int
    database_name: str
    ledger_columns: list[str] = field(default_factory=list)
    pgflow_relations: int = 0
    pgflow_functions: int = 0

    @property
    def pgmq_version(self) -> str | None:
        """PGMQ version: the extension's, or the one pgflow-cli recorded for a SQL-only install."""
        if self.pgmq_extension_version:
            return self.pgmq_extension_version
        match = re.search(r"PGMQ (\S+)", self.pgmq_schema_comment or "")
        return match.group(1) if match else None

    @property
    def foreign_pgflow(self) -> bool:
        """A pgflow schema with tables that pgflow-cli did not install (no ledger)."""
        return self.has_flows_table and not self.has_ledger

    @property
    def foreign_ledger(self) -> bool:
        """A ``pgflow.schema_migrations`` that is not pgflow-cli's ledger (other columns)."""
        return self.has_ledger and not set(LEDGER_COLUMNS) <= set(self.ledger_columns)

    @property
    def partial_pgflow(self) -> bool:
        """A pgflow schema holding objects (functions, types, tables) but neither the ledger nor
        the flows table: a partial or hand-made installation the first migration would collide with."""
        return (self.has_pgflow_schema and not self.has_ledger and not self.has_flows_table
                and (self.pgflow_relations > 0 or self.pgflow_functions > 0))


LEDGER_COLUMNS = ("version", "name", "checksum", "tool_version", "applied_by", "applied_at", "duration_ms",
                  "state", "phases_done")
"""Columns of pgflow-cli's ledger (sql/queries/installer.sql ``ledger_bootstrap``)."""


def read_state(conn: psycopg.Connection) -> DatabaseState:
    """Probe the catalog for the pgflow schema, the ledger and PGMQ."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sqlfiles.statement(QUERIES, "database_state"))
        row = cur.fetchone()
    assert row is not None
    return DatabaseState(**row)


@dataclass(frozen=True)
class LedgerRow:
    version: int
    name: str
    checksum: str
    tool_version: str
    applied_by: str
    applied_at: Any
    duration_ms: int
    state: str = "applied"
    phases_done: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class MigrationStatus:
    """A migration's state in one database.

    ``state`` is one of ``applied``, ``pending``, ``in_progress`` (a phased migration that
    committed some phases; applying resumes it), ``changed`` (file differs from the recorded
    checksum), ``unknown`` (recorded, but this tool has no such file) or ``superseded`` (a row of an
    earlier build's migrations 0003-0016, which ``0003_queue_stage`` replaces: :attr:`Plan.old`).
    """

    version: int
    name: str
    state: str
    file_checksum: str | None
    recorded: LedgerRow | None = None


@dataclass
class Plan:
    """Comparison of shipped migrations with a database's ledger."""

    state: DatabaseState
    statuses: list[MigrationStatus] = field(default_factory=list)
    files: list[FunctionDrift] = field(default_factory=list)
    """Every function file compared with the catalog; only at the newest level (nothing pending or in
    progress, no conflict), empty otherwise."""
    invalid_indexes: list[str] = field(default_factory=list)
    """``pgflow.<index>`` names of INVALID indexes (an interrupted ``CREATE INDEX CONCURRENTLY``)."""
    old: old_levels.OldLedger | None = None
    """The rows of an earlier build's migrations 0003-0016, when the ledger has them."""

    @property
    def file_drift(self) -> list[FunctionDrift]:
        """Function files whose installed functions differ from the file (at the newest level)."""
        return [f for f in self.files if f.state != "current"]

    @property
    def conversion(self) -> old_levels.OldLedger | None:
        """The old-level rows ``apply`` converts into the first pending migration (they are all there,
        applied, with known checksums), or ``None``."""
        return self.old if self.old is not None and self.old.convertible else None

    def converts(self, migration: Migration) -> bool:
        """True when applying ``migration`` here is the conversion of old-level rows, not its text."""
        return self.conversion is not None and migration.version == old_levels.FIRST

    @property
    def pending(self) -> list[Migration]:
        by_version = {m.version: m for m in available_migrations()}
        return [by_version[s.version] for s in self.statuses
                if s.state in ("pending", "in_progress") and s.version in by_version]

    @property
    def in_progress(self) -> list[MigrationStatus]:
        """Phased migrations that committed some phases but not the last (apply resumes, abort undoes)."""
        return [s for s in self.statuses if s.state == "in_progress"]

    @property
    def changed(self) -> list[MigrationStatus]:
        return [s for s in self.statuses if s.state == "changed"]

    @property
    def unknown(self) -> list[MigrationStatus]:
        return [s for s in self.statuses if s.state == "unknown"]

    def refuse_reasons(self) -> StateConflict | None:
        """The conflict that forbids applying anything, or ``None``."""
        if self.state.foreign_ledger:
            return StateConflict(
                "pgflow.schema_migrations exists but is not pgflow-cli's migration ledger (it has other columns)",
                hint="another tool owns a table of that name in the pgflow schema; move it elsewhere (ALTER TABLE ... "
                "SET SCHEMA) or use a database without it; pgflow-cli never changes a table it did not create",
                detail=[f"columns found: {', '.join(self.state.ledger_columns) or 'none'}",
                        f"columns expected: {', '.join(LEDGER_COLUMNS)}"],
            )
        if self.state.partial_pgflow:
            return StateConflict(
                f"the pgflow schema holds {self.state.pgflow_functions} function(s) and {self.state.pgflow_relations} "
                "table(s)/type(s) but no pgflow-cli ledger and no pgflow.flows table: a partial installation that "
                "pgflow-cli did not make",
                hint="find out what created them (`\\df pgflow.*`, `\\d pgflow.*` in psql); if nothing uses them, drop "
                "them (DROP SCHEMA pgflow CASCADE removes everything in it) and apply again",
            )
        if self.state.foreign_pgflow:
            return StateConflict(
                "this database has a pgflow schema that pgflow-cli did not install (no pgflow.schema_migrations ledger)",
                hint="`pgflow migrate apply` adopts it first (`pgflow migrate plan` names the release it recognised); "
                "see docs/upgrade.md \"Databases installed by pgflow itself\"",
            )
        if self.old is not None and not self.old.convertible:
            return StateConflict(
                f"the ledger records migrations {old_levels.FIRST:04d}-{self.old.newest:04d} of an earlier pgflow-cli "
                f"build; this build replaces {old_levels.FIRST:04d}-{old_levels.LAST:04d} by one migration and converts "
                "only a ledger where all of them are applied with the texts that build shipped",
                hint=f"finish the upgrade with the build that wrote them: install pgflow-cli from commit "
                f"{old_levels.OLD_BUILD} (`pip install .` in a checkout of that commit), run its `pgflow migrate apply` "
                "(a phased run it left in progress resumes; `pgflow migrate abort N` undoes one instead), then run "
                "this tool's `pgflow migrate apply` again; nothing was changed",
                detail=self.old.problems(),
            )
        if self.unknown:
            return StateConflict(
                "the database is newer than this tool: it records migrations this version does not ship",
                hint="upgrade pgflow-cli to the version that applied them",
                detail=[f"{s.version:04d}_{s.name} (applied by pgflow-cli {s.recorded.tool_version if s.recorded else '?'})"
                        for s in self.unknown],
            )
        if self.changed:
            return StateConflict(
                "migration files differ from what was applied (checksum mismatch)",
                hint="reinstall the pgflow-cli version that applied them; never edit an applied migration",
                detail=[f"sql/migrations/{s.version:04d}_{s.name}.sql: recorded {s.recorded.checksum[:12] if s.recorded else '?'}…,"
                        f" file {(s.file_checksum or '')[:12]}…" for s in self.changed],
            )
        return None


def ledger(conn: psycopg.Connection) -> list[LedgerRow]:
    """Rows of ``pgflow.schema_migrations`` (empty when there is no ledger)."""
    state = read_state(conn)
    if not state.has_ledger or state.foreign_ledger:
        return []
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sqlfiles.statement(QUERIES, "ledger_rows"))
        return [LedgerRow(**row) for row in cur.fetchall()]


def make_plan(conn: psycopg.Connection) -> Plan:
    """Compare the shipped migrations with the database's ledger (read-only); at the newest level,
    also the installed functions with the function files (:attr:`Plan.files`)."""
    state = read_state(conn)
    recorded = {row.version: row for row in (ledger(conn) if state.has_ledger and not state.foreign_ledger else [])}
    plan = Plan(state)
    plan.old = old_levels.classify([
        old_levels.OldRow(row.version, row.name, row.checksum, row.state)
        for row in recorded.values() if old_levels.FIRST <= row.version <= old_levels.LAST])
    if plan.old is not None:
        for old in plan.old.rows:
            plan.statuses.append(MigrationStatus(old.version, old.name, "superseded", None, recorded.pop(old.version)))
    for migration in available_migrations():
        row = recorded.pop(migration.version, None)
        if row is None:
            plan.statuses.append(MigrationStatus(migration.version, migration.name, "pending", migration.checksum))
        elif row.checksum != migration.checksum:
            plan.statuses.append(MigrationStatus(migration.version, migration.name, "changed", migration.checksum, row))
        elif row.state == "in_progress":
            plan.statuses.append(MigrationStatus(migration.version, migration.name, "in_progress", migration.checksum, row))
        else:
            plan.statuses.append(MigrationStatus(migration.version, migration.name, "applied", migration.checksum, row))
    for row in recorded.values():
        plan.statuses.append(MigrationStatus(row.version, row.name, "unknown", None, row))
    plan.statuses.sort(key=lambda s: (s.state == "superseded", s.version))
    if state.has_pgflow_schema:
        plan.invalid_indexes = [r[0] for r in conn.execute(sqlfiles.statement(QUERIES, "invalid_indexes")).fetchall()]
    if state.has_ledger and not plan.pending and plan.refuse_reasons() is None:
        plan.files = function_drift(conn, function_files(), optional_function_files())
    return plan

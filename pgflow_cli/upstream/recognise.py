"""Which pgflow installed this database? Read-only recognition from catalog facts alone.

One catalog query (``sql/queries/recognise.sql`` ``catalog_facts``) lists the tables, columns
(type, nullability, default), composite type attributes, constraints, indexes and function
signatures of schema ``pgflow``; the result is compared with the shape of every published
release group (:mod:`pgflow_cli.upstream.releases`). Up to two more small queries read the
pg_cron jobs and the Supabase CLI's migration history when those tables exist. Nothing is
written and no pgflow table is scanned.

Spec: issue 8 "Recognition, read-only"; fact sheet ``upstream-releases.md`` §3.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgflow_cli import sqlfiles
from pgflow_cli.installer.catalog import Difference
from pgflow_cli.installer.catalog import compare as compare_shapes
from pgflow_cli.upstream import releases
from pgflow_cli.upstream.releases import GROUPS, KINDS

QUERIES = "queries/recognise.sql"

NONE = "none"
PGFLOW_CLI = "pgflow-cli"
ADOPTED = "adopted"
UPSTREAM = "upstream"
UNRECOGNISED = "unrecognised"

_CALL = re.compile(r"pgflow\.([a-z_][a-z0-9_]*)\s*\(", re.IGNORECASE)
_HISTORY_NAME = re.compile(r"(?:^|_)(?P<ts>\d{14})_pgflow_")


@dataclass(frozen=True)
class CronJob:
    """A pg_cron job whose command calls pgflow.

    Attributes:
        jobid, jobname, schedule, command, active: the ``cron.job`` row.
        calls: the ``pgflow.*`` functions the command calls.
        missing: those of ``calls`` that pgflow-cli's runtime does not provide.
    """

    jobid: int
    jobname: str | None
    schedule: str
    command: str
    active: bool
    calls: tuple[str, ...]
    missing: tuple[str, ...]

    @property
    def keeps_working(self) -> bool:
        return not self.missing

    def verdict(self) -> str:
        """What happens to the job after adoption, and what the operator must do, in words."""
        name = self.jobname or f"job {self.jobid}"
        if self.keeps_working:
            return (f"cron job {name} ({self.schedule}: {self.command.strip()}) keeps working: pgflow-cli's runtime "
                    f"provides {', '.join('pgflow.' + c for c in self.calls)} with the same call")
        return (f"cron job {name} ({self.schedule}: {self.command.strip()}) will fail after adoption: "
                f"{', '.join('pgflow.' + c for c in self.missing)} does not exist in pgflow-cli's runtime; "
                f"unschedule it (SELECT cron.unschedule({self.jobid})) or point it at a function that exists")

    def to_dict(self) -> dict[str, Any]:
        return {"jobid": self.jobid, "jobname": self.jobname, "schedule": self.schedule, "command": self.command,
                "active": self.active, "keeps_working": self.keeps_working, "missing": list(self.missing)}


@dataclass(frozen=True)
class SupabaseHistory:
    """The Supabase CLI's record of pgflow migrations (``supabase_migrations.schema_migrations``).

    Attributes:
        rows: ``(version, name)`` of every row naming a pgflow migration.
        releases: the release group the newest original migration timestamp belongs to
            (fact sheet §3.2), empty when it is not one recognition knows.
    """

    rows: tuple[tuple[str, str], ...]
    releases: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [list(r) for r in self.rows], "releases": list(self.releases)}


@dataclass(frozen=True)
class Recognition:
    """What installed the pgflow schema of a database.

    Attributes:
        status: ``none`` (no pgflow schema or tables), ``pgflow-cli`` (this tool's ledger, or
            its baseline without a ledger, see ``notes``), ``adopted`` (an upstream install
            that pgflow-cli adopted; ``adoption`` holds the record), ``upstream`` (a published
            release, ``releases`` lists the indistinguishable members) or ``unrecognised``
            (``releases`` is the nearest group, ``differences`` says how the schema differs).
        releases: release versions, oldest first (empty for ``none``/``pgflow-cli``).
        differences: shape differences against ``releases`` (empty when recognised).
        body_differences: functions whose body is not the one the release shipped (edited by
            hand); recognition still holds, adoption replaces them.
        cron_jobs: pg_cron jobs that call pgflow functions.
        supabase: the Supabase CLI history of pgflow migrations, ``None`` when there is none.
        adoption: the adoption record (``status == "adopted"``).
        notes: other observations, one sentence each.
        pgmq_version: the pgmq extension version, ``None`` for a SQL-only PGMQ or none.
        optional: functions of :data:`releases.OPTIONAL_FUNCTIONS` that are installed (names).
        assumed: the schema is unrecognised and the operator asserted a release; the
            differences are against that release.
        asserted_release: that release (``--assume-release``).
    """

    status: str
    releases: tuple[str, ...] = ()
    differences: tuple[Difference, ...] = ()
    body_differences: tuple[str, ...] = ()
    cron_jobs: tuple[CronJob, ...] = ()
    supabase: SupabaseHistory | None = None
    adoption: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()
    pgmq_version: str | None = None
    optional: tuple[str, ...] = ()
    assumed: bool = False
    asserted_release: str | None = None

    @property
    def recognised(self) -> bool:
        """True when the schema is a known upstream release (adoption may proceed)."""
        return self.status == UPSTREAM

    @property
    def adoptable(self) -> bool:
        """True when adoption may proceed: recognised, or a release asserted by the operator."""
        return self.status == UPSTREAM or (self.status == UNRECOGNISED and self.assumed)

    @property
    def label(self) -> str:
        """``"0.8.0/0.8.1/0.9.0/0.9.1"``, or ``""``."""
        return "/".join(self.releases)

    @property
    def release(self) -> str | None:
        """The release adoption records: the one the operator asserted, else the newest member of
        ``releases``, or ``None``."""
        if self.asserted_release:
            return self.asserted_release
        return self.releases[-1] if self.releases else None

    def summary(self) -> str:
        """One line for ``migrate status``/``plan`` and ``audit``."""
        if self.status == NONE:
            return "no pgflow schema"
        if self.status == PGFLOW_CLI:
            return "installed by pgflow-cli" + ("" if not self.notes else f" ({self.notes[0]})")
        if self.status == ADOPTED:
            record = self.adoption or {}
            assumed = " (asserted by the operator)" if record.get("assumed") else ""
            label = record.get("release") if record.get("assumed") else "/".join(record.get("releases") or ["?"])
            return f"adopted from pgflow {label}{assumed} by {record.get('adopted_by', '?')}"
        if self.status == UPSTREAM:
            return f"installed by pgflow {self.label} (recognised from the catalog)"
        if self.assumed:
            return (f"unrecognised pgflow schema, asserted to be pgflow {self.release} by the operator: "
                    f"{len(self.differences)} difference(s) from that release")
        return (f"unrecognised pgflow schema: {len(self.differences)} difference(s) from the nearest release, "
                f"pgflow {self.label}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "releases": list(self.releases),
            "summary": self.summary(),
            "differences": [d.to_dict() for d in self.differences],
            "body_differences": list(self.body_differences),
            "cron_jobs": [j.to_dict() for j in self.cron_jobs],
            "supabase": self.supabase.to_dict() if self.supabase else None,
            "adoption": self.adoption,
            "notes": list(self.notes),
            "optional": list(self.optional),
            "assumed": self.assumed,
        }


@dataclass
class CatalogFacts:
    """The rows of ``catalog_facts``, grouped: ``objects[kind][key] = detail``."""

    objects: dict[str, dict[str, str]] = field(default_factory=lambda: {kind: {} for kind in KINDS})
    bodies: dict[str, str] = field(default_factory=dict)
    constraint_definitions: dict[str, str] = field(default_factory=dict)
    context: dict[str, str | None] = field(default_factory=dict)

    def present(self, name: str) -> bool:
        return self.context.get(name) == "present"


def read_facts(conn: psycopg.Connection) -> CatalogFacts:
    """Run the catalog query (one statement, catalog reads only) and group its rows."""
    facts = CatalogFacts()
    for kind, name, detail, body in conn.execute(sqlfiles.statement(QUERIES, "catalog_facts")).fetchall():
        if kind == "context":
            facts.context[name] = detail
            continue
        if kind == "function":
            facts.bodies[name] = body
        elif kind == "constraint":
            facts.constraint_definitions[name] = body
        facts.objects[kind][name] = detail
    return facts


def compare(expected: Mapping[str, Mapping[str, str]], found: Mapping[str, Mapping[str, str]]) -> list[Difference]:
    """Every difference between a release shape and the database's objects, in a stable order."""
    return compare_shapes(expected, found, KINDS, source="release has")


def body_differences(group_index: int, bodies: Mapping[str, str]) -> list[str]:
    """Functions whose md5(prosrc) prefix is not the one ``GROUPS[group_index]`` shipped."""
    return sorted(key.split("(", 1)[0] + f" (body {bodies[key]}, release {md5})"
                  for key, md5 in releases.expected_bodies(group_index).items()
                  if key in bodies and bodies[key] != md5)


def match(facts: CatalogFacts) -> tuple[list[int], list[Difference], list[str]]:
    """The release groups nearest to ``facts``: ``(indexes, shape differences, body differences)``.

    The groups with the fewest shape differences win; among them (0.13.2 and 0.13.3 share a
    shape) those with the fewest body differences. When that still leaves several (function
    bodies edited, so they tell nothing), all of them are returned, oldest first: the range of
    releases the facts cannot tell apart. The differences are those of the newest of them.
    """
    scored = []
    for index in range(len(GROUPS)):
        diffs = compare(releases.shape(index), facts.objects)
        bodies = body_differences(index, facts.bodies)
        scored.append((len(diffs), len(bodies), index, diffs, bodies))
    best = min(s[:2] for s in scored)
    tied = [s for s in scored if s[:2] == best]
    return [s[2] for s in tied], tied[-1][3], tied[-1][4]


def _cron_jobs(conn: psycopg.Connection, facts: CatalogFacts) -> tuple[CronJob, ...]:
    from pgflow_cli.upstream.adopt import baseline_function_names

    kept = {key.split("(", 1)[0] for key in facts.objects["function"]} - set(releases.REPLACED_BY)
    ours = set(baseline_function_names()) | kept
    jobs = []
    with conn.cursor(row_factory=dict_row) as cur:
        for row in cur.execute(sqlfiles.statement(QUERIES, "cron_jobs")).fetchall():
            calls = tuple(dict.fromkeys(name.lower() for name in _CALL.findall(row["command"] or "")))
            jobs.append(CronJob(int(row["jobid"]), row["jobname"], str(row["schedule"]), row["command"] or "",
                                bool(row["active"]), calls, tuple(c for c in calls if c not in ours)))
    return tuple(jobs)


def _supabase_history(conn: psycopg.Connection) -> SupabaseHistory | None:
    rows = tuple((str(v), str(n)) for v, n in conn.execute(sqlfiles.statement(QUERIES, "supabase_history")).fetchall())
    if not rows:
        return None
    stamps = []
    for version, name in rows:
        found = _HISTORY_NAME.search(name)
        if found:
            stamps.append(found["ts"])
        elif name.startswith("pgflow_") and version.isdigit():
            stamps.append(version)  # applied under its original name: version = original timestamp
    newest = max(stamps) if stamps else None
    group = releases.HISTORY_MARKERS.get(newest) if newest else None
    return SupabaseHistory(rows, GROUPS[group].releases if group is not None else ())


def recognise(conn: psycopg.Connection, *, assume_release: str | None = None) -> Recognition:
    """Recognise what installed the pgflow schema of ``conn``'s database (read-only).

    Args:
        conn: an open connection (any transaction state; only catalog reads are issued).
        assume_release: the operator's assertion (``--assume-release``) for a schema that is
            not recognised: the differences are then taken against that release and the
            result is marked ``assumed``. Ignored when the schema is recognised or not upstream.

    Returns:
        A :class:`Recognition`. Never raises for an unexpected schema: that is
        ``status == "unrecognised"`` with its differences.

    Raises:
        KeyError: ``assume_release`` is not a release recognition knows.
    """
    facts = read_facts(conn)
    pgmq_version = facts.context.get("pgmq_version")
    if facts.present("ledger"):
        if facts.present("adoption_record"):
            with conn.cursor(row_factory=dict_row) as cur:
                record = cur.execute(sqlfiles.statement(QUERIES, "adoption_record")).fetchone()
            if record:
                return Recognition(ADOPTED, tuple(record["releases"]), adoption=dict(record),
                                   pgmq_version=pgmq_version)
        return Recognition(PGFLOW_CLI, pgmq_version=pgmq_version)
    if not facts.present("schema") or not (facts.objects["table"] or facts.objects["function"]):
        return Recognition(NONE, pgmq_version=pgmq_version)
    optional = tuple(sorted(key.split("(", 1)[0] for key in releases.OPTIONAL_FUNCTIONS
                            if facts.objects["function"].get(key) == releases.OPTIONAL_FUNCTIONS[key]))
    for key in releases.OPTIONAL_FUNCTIONS:
        if key.split("(", 1)[0] in optional:
            del facts.objects["function"][key]
    if "protocol_version()" in facts.objects["function"]:
        return Recognition(PGFLOW_CLI, notes=("its pgflow.schema_migrations ledger is missing",),
                           pgmq_version=pgmq_version)

    indexes, diffs, bodies = match(facts)
    assumed = bool(diffs and assume_release)
    if assumed:
        indexes = [releases.group_of(assume_release)]  # type: ignore[arg-type]
        diffs = compare(releases.shape(indexes[0]), facts.objects)
        bodies = body_differences(indexes[0], facts.bodies)
    group = GROUPS[indexes[-1]]
    members = tuple(r for i in indexes for r in GROUPS[i].releases)
    cron = _cron_jobs(conn, facts) if facts.present("cron_jobs") else ()
    supabase = _supabase_history(conn) if facts.present("supabase_history") else None
    notes = list(group.notes) if not diffs else []
    if supabase and supabase.releases and not set(supabase.releases) & set(members):
        notes.append(f"the Supabase migration history names pgflow {'/'.join(supabase.releases)}, "
                     f"the catalog matches {'/'.join(members)}")
    if optional:
        notes.append(f"pgflow's optional {', '.join(optional)} is installed: adoption replaces it by pgflow-cli's "
                     "version (sql/optional), keeping its grants")
    if bodies:
        notes.append(f"{len(bodies)} function bod(ies) differ from the release's (edited by hand?); "
                     "adoption replaces them all")
    return Recognition(
        UPSTREAM if not diffs else UNRECOGNISED, members, tuple(diffs), tuple(bodies), cron, supabase,
        notes=tuple(notes), pgmq_version=pgmq_version, optional=optional, assumed=assumed,
        asserted_release=assume_release if assumed else None,
    )

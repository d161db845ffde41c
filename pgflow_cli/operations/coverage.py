"""``pgflow coverage``: persisted routes versus live workers (spec "Worker coverage").

Compilation never waits for workers; a route without a live worker keeps its tasks queued
durably. This operation compares every persisted route (a plain flow's default queue, or each
step's private queue of a step-queued flow) with the worker rows, read-only, and gives each
route one state (docs/coverage.md):

``covered``, ``draining``, ``fenced``, ``stale``, ``uncovered``, ``queue_missing``.

The SQL is ``sql/queries/coverage.sql``; it needs only SELECT (and USAGE on the schemas).
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from pgflow_cli import __version__, sqlfiles
from pgflow_cli.db import transaction
from pgflow_cli.errors import DeadlineReached, ExitCode, StateConflict, UsageError
from pgflow_cli.operations import names
from pgflow_cli.operations.waiting import pause

COVERAGE_SQL = "queries/coverage.sql"

DOCUMENT_KIND = "pgflow-cli/coverage"
DOCUMENT_VERSION = 2
"""2: ``kind`` in the common ``pgflow-cli/`` namespace (was ``pgflow-coverage``) and a ``database`` object."""

STATES = ("covered", "draining", "fenced", "stale", "uncovered", "queue_missing")
"""Every route state, healthy first (docs/coverage.md)."""

DEFAULT_HEARTBEAT_WINDOW = 15.0
"""Seconds: three heartbeat intervals of the reference worker (5 s), so one late beat does not flap a route."""


@dataclass(frozen=True)
class _Record:
    """``to_dict()`` for the report's row dataclasses (JSON and CSV output)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Route(_Record):
    """One persisted route and who serves it.

    Attributes:
        flow_slug: the concrete flow.
        step_slug: the step of a step-queued flow; ``None`` for a plain flow (the whole flow).
        step_index: zero-based step position, ``None`` for a plain flow.
        queue_mode: ``flow`` or ``step``.
        queue_name: the PGMQ queue the route's tasks are sent to.
        state: one of :data:`STATES`.
        live_workers: workers heartbeating within the window, not deprecated, not stopped.
        live_versions: distinct versions those workers reported at registration
            (``"(not reported)"`` where they reported none).
        draining_workers: deprecated workers still heartbeating (finishing running tasks).
        draining_versions: their versions.
        stale_workers: workers whose heartbeat is older than the window but never stopped.
        last_heartbeat_at: newest heartbeat of any unstopped worker of the route.
        functions: every worker function that registered a worker for the route.
        fenced_functions: those disabled (``worker_functions.enabled = false``).
        queue_exists: the PGMQ queue table exists.
        queue_readable: this role may read it (backlog is ``None`` otherwise).
        backlog: messages in the queue (visible or not); ``None`` if unknown.
        visible_messages: of those, readable right now.
        oldest_message_age_seconds: age of the oldest message; ``None`` when empty.
        work_waiting: no live worker while messages wait.
    """

    flow_slug: str
    step_slug: str | None
    step_index: int | None
    queue_mode: str
    queue_name: str
    state: str
    live_workers: int
    live_versions: list[str]
    draining_workers: int
    draining_versions: list[str]
    stale_workers: int
    last_heartbeat_at: dt.datetime | None
    functions: list[str]
    fenced_functions: list[str]
    queue_exists: bool
    queue_readable: bool
    backlog: int | None
    visible_messages: int | None
    oldest_message_age_seconds: float | None
    work_waiting: bool

    @property
    def label(self) -> str:
        """``flow`` or ``flow/step``, plus the queue: how messages name a route."""
        name = self.flow_slug if self.step_slug is None else f"{self.flow_slug}/{self.step_slug}"
        return f"{name} (queue {self.queue_name})"

    @property
    def covered(self) -> bool:
        """The route has at least one live worker."""
        return self.state == "covered"


@dataclass(frozen=True)
class UnownedWorker(_Record):
    """A live or draining worker polling a (flow, step, queue) that no persisted route has."""

    worker_id: str
    function_name: str
    queue_name: str
    flow_slug: str | None
    step_slug: str | None
    worker_version: str | None
    last_heartbeat_at: dt.datetime
    deprecated: bool


@dataclass
class CoverageReport:
    """The result of one coverage check.

    Attributes:
        routes: every selected route, in flow and step order.
        unowned_workers: workers polling what no route owns.
        heartbeat_window: the liveness window used, seconds.
        flow_filter: the ``--flow`` slugs, or ``None`` for every flow.
        missing_flows: filter slugs that name no flow (only while ``--wait`` is waiting).
        checked_at: when the check ran (database clock).
    """

    routes: list[Route]
    unowned_workers: list[UnownedWorker]
    heartbeat_window: float
    flow_filter: tuple[str, ...] | None
    missing_flows: list[str] = field(default_factory=list)
    checked_at: dt.datetime | None = None

    @property
    def not_covered(self) -> list[Route]:
        """Routes in any state but ``covered``."""
        return [r for r in self.routes if not r.covered]

    @property
    def covered(self) -> bool:
        """Every selected route is covered and every selected flow exists."""
        return not self.not_covered and not self.missing_flows

    def counts(self) -> dict[str, int]:
        """``{state: routes}`` for every state (zeros included)."""
        found = Counter(r.state for r in self.routes)
        return {state: found.get(state, 0) for state in STATES}

    def exit_code(self) -> int:
        """0 when every route is covered, else 1 (docs/exit-codes.md)."""
        return int(ExitCode.OK if self.covered else ExitCode.FINDINGS)

    def describe_missing(self) -> list[str]:
        """One line per route that is not covered (and per awaited flow that does not exist)."""
        lines = [f"flow {slug}: does not exist yet" for slug in self.missing_flows]
        for route in self.not_covered:
            line = f"{route.label}: {route.state}"
            if route.work_waiting and route.backlog:
                line += f", {route.backlog} message(s) waiting"
            lines.append(line)
        return lines

    def to_document(self) -> dict[str, Any]:
        """The versioned JSON document (docs/coverage.md "JSON")."""
        return {
            "kind": DOCUMENT_KIND,
            "version": DOCUMENT_VERSION,
            "tool_version": __version__,
            "checked_at": self.checked_at,
            "heartbeat_window_seconds": self.heartbeat_window,
            "filter": {"flows": list(self.flow_filter) if self.flow_filter is not None else None},
            "summary": {
                "routes": len(self.routes),
                "states": self.counts(),
                "work_waiting": sum(1 for r in self.routes if r.work_waiting),
                "unowned_workers": len(self.unowned_workers),
                "missing_flows": self.missing_flows,
                "covered": self.covered,
                "exit_code": self.exit_code(),
            },
            "routes": [r.to_dict() for r in self.routes],
            "unowned_workers": [w.to_dict() for w in self.unowned_workers],
        }


def _params(flows: tuple[str, ...] | None, heartbeat_window: float) -> dict[str, Any]:
    if heartbeat_window <= 0:
        raise UsageError(f"--heartbeat-window must be a positive number of seconds, got {heartbeat_window}")
    return {"flows": list(flows) if flows else None, "heartbeat_window": float(heartbeat_window)}


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (Decimal, int, float)) else None


def check_coverage(
    conn: psycopg.Connection,
    flows: Iterable[str] | None = None,
    *,
    heartbeat_window: float = DEFAULT_HEARTBEAT_WINDOW,
    allow_missing_flows: bool = False,
    statement_timeout: float | None = 60.0,
) -> CoverageReport:
    """Compare persisted routes with worker rows, in one read-only transaction.

    Args:
        conn: an autocommit connection (:func:`pgflow_cli.db.connect`).
        flows: exact flow slugs to check; ``None`` or empty for every flow.
        heartbeat_window: seconds; a worker is live when its last heartbeat is at most this old.
        allow_missing_flows: report filter slugs that name no flow in ``missing_flows``
            instead of refusing (``--wait``: the flow may be compiled by a starting worker).
        statement_timeout: seconds each statement may run (``None``: no limit).

    Returns:
        The :class:`CoverageReport`.

    Raises:
        StateConflict: a ``--flow`` names no flow (exit 6), unless ``allow_missing_flows``.
        UsageError: a non-positive window (exit 2).
        psycopg.Error: anything else from the server (the CLI maps it).
    """
    wanted = tuple(dict.fromkeys(flows)) if flows else None
    params = _params(wanted, heartbeat_window)
    with transaction(conn, read_only=True, isolation="repeatable read", statement_timeout=statement_timeout):
        with conn.cursor(row_factory=dict_row) as cur:
            checked_at = cur.execute("SELECT pg_catalog.clock_timestamp() AS now").fetchone()["now"]  # type: ignore[index]
            missing: list[str] = []
            if wanted:
                row = cur.execute(sqlfiles.statement(COVERAGE_SQL, "known_flows"), params).fetchone()
                known = set((row or {}).get("flows") or [])
                missing = [slug for slug in wanted if slug not in known]
            if missing and not allow_missing_flows:
                raise StateConflict(
                    f"no flow named {names.unknown_flows(conn, missing)}",
                    hint="flow slugs are exact and case-sensitive; a flow exists once a worker of it has started "
                    "(use --wait to wait for it)",
                )
            route_rows = cur.execute(sqlfiles.statement(COVERAGE_SQL, "routes"), params).fetchall()
            worker_rows = cur.execute(sqlfiles.statement(COVERAGE_SQL, "unowned_workers"), params).fetchall()
    routes = [
        Route(
            **{**row, "live_versions": list(row["live_versions"]), "draining_versions": list(row["draining_versions"]),
               "functions": list(row["functions"]), "fenced_functions": list(row["fenced_functions"]),
               "oldest_message_age_seconds": _float(row["oldest_message_age_seconds"])}
        )
        for row in route_rows
    ]
    unowned = [UnownedWorker(**{**row, "worker_id": str(row["worker_id"])}) for row in worker_rows]
    return CoverageReport(routes, unowned, heartbeat_window, wanted, missing, checked_at)


def wait_for_coverage(
    conn: psycopg.Connection,
    flows: Iterable[str] | None = None,
    *,
    heartbeat_window: float = DEFAULT_HEARTBEAT_WINDOW,
    timeout: float,
    interval: float = 2.0,
    progress: Callable[[CoverageReport, float], None] | None = None,
) -> CoverageReport:
    """Check repeatedly until every selected route is covered, or fail at the deadline.

    Args:
        conn: an autocommit connection.
        flows: as for :func:`check_coverage`; flows that do not exist yet are waited for.
        heartbeat_window: seconds, as for :func:`check_coverage`.
        timeout: seconds until the deadline.
        interval: seconds between checks.
        progress: called after every check that is not yet covered, with the report and the
            seconds left (the CLI prints a line on stderr), and again at least every 5 s meanwhile
            (:func:`pgflow_cli.operations.waiting.pause`) with the last report.

    Returns:
        The first report in which everything is covered.

    Raises:
        DeadlineReached: still not covered at the deadline (exit 5); the detail names every
            route that is not covered, with its state and waiting messages.
    """
    if timeout <= 0 or interval <= 0:
        raise UsageError("--timeout and --interval must be positive numbers of seconds")
    deadline = time.monotonic() + timeout
    while True:
        report = check_coverage(conn, flows, heartbeat_window=heartbeat_window, allow_missing_flows=True)
        if report.covered:
            return report
        left = deadline - time.monotonic()
        if left <= 0:
            missing = report.describe_missing()
            raise DeadlineReached(
                f"coverage not reached within {timeout:g} s: {len(missing)} route(s) or flow(s) without a live worker",
                hint="start workers for these routes (`pgflow worker MODULE:FLOW [--step SLUG]`), or lift a fence; "
                "`pgflow coverage` shows every route",
                detail=missing,
            )
        if progress is not None:
            progress(report, left)
        pause(min(interval, max(left, 0.05)),
              None if progress is None else functools.partial(_report_again, progress, report, deadline))


def _report_again(progress: Callable[[CoverageReport, float], None], report: CoverageReport, deadline: float) -> None:
    """While waiting between checks: the last report again, with the seconds left now."""
    progress(report, deadline - time.monotonic())


_PARAM = re.compile(r"%\((?P<name>[a-z_]+)\)s")


def psql_script(flows: Sequence[str] | None = None, heartbeat_window: float = DEFAULT_HEARTBEAT_WINDOW) -> str:
    """The two coverage statements with their parameters filled in, as a read-only psql script.

    Args:
        flows: exact flow slugs, or ``None`` for every flow.
        heartbeat_window: seconds.

    Returns:
        Text for ``psql -f`` (``BEGIN READ ONLY`` ... ``ROLLBACK``), values quoted as SQL literals.
    """
    params = _params(tuple(flows) if flows else None, heartbeat_window)
    literals = {name: sql.Literal(value).as_string(None) for name, value in params.items()}

    def fill(text: str) -> str:
        return _PARAM.sub(lambda m: literals[m.group("name")], text).replace("%%", "%")

    flows_text = ", ".join(flows) if flows else "every flow"
    parts = [
        "-- pgflow coverage: persisted routes versus live workers (docs/coverage.md), read-only.",
        f"-- heartbeat window {heartbeat_window:g} s; flows: {flows_text}. Generated by pgflow-cli {__version__}.",
        "\\set ON_ERROR_STOP on",
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;",
        "",
        "-- routes: one row per route with its state",
        fill(sqlfiles.statement(COVERAGE_SQL, "routes")).strip() + ";",
        "",
        "-- workers polling queues no route owns",
        fill(sqlfiles.statement(COVERAGE_SQL, "unowned_workers")).strip() + ";",
        "",
        "ROLLBACK;",
        "",
    ]
    return "\n".join(parts)

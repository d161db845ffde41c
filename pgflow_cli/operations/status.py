"""``pgflow status``: what runs, per flow, in one read-only snapshot (docs/commands/status.md).

Per flow: runs by state, tasks by state, the oldest queued task and its age, stalled tasks (the
candidates of the next ``pgflow.requeue_stalled_tasks()`` call, by that function's own rule, and
those it gave up on), the backlog of every queue the flow uses (its queue or its steps' private
queues: pgmq.metrics()'s numbers, counted from each queue table) and its workers (live,
deprecated, stale, by the liveness rule of ``pgflow coverage``).

The SQL is ``sql/queries/status.sql``; it runs on every schema level from the protocol-1 baseline
on and needs only SELECT on the pgflow and pgmq tables.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgflow_cli import sqlfiles
from pgflow_cli.db import scalar, transaction
from pgflow_cli.errors import StateConflict
from pgflow_cli.operations import names
from pgflow_cli.operations.coverage import DEFAULT_HEARTBEAT_WINDOW

QUERIES = "queries/status.sql"

DOCUMENT_KIND = "pgflow-cli/status"
DOCUMENT_VERSION = 1

RUN_STATES = ("started", "completed", "failed")
"""Run states in display order (``started`` = in flight)."""
TASK_STATES = ("queued", "started", "completed", "failed", "skipped", "cancelled")
"""Task states in display order."""


def utc_iso(value: dt.datetime | None) -> str | None:
    """ISO 8601 in UTC (``...+00:00``), or None: the one timestamp spelling of the JSON documents."""
    return value.astimezone(dt.timezone.utc).isoformat() if value is not None else None


@dataclass(frozen=True)
class OldestQueued:
    """The queued task of a flow that has waited longest.

    Attributes:
        run_id: its run (UUID text).
        step_slug: its step.
        task_index: 0 for a single step, the element index of a map step.
        queued_at: when it was (re)queued, timezone-aware.
        age_seconds: seconds since ``queued_at``, at the snapshot.
    """

    run_id: str
    step_slug: str
    task_index: int
    queued_at: dt.datetime
    age_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "queued_at": utc_iso(self.queued_at)}


@dataclass(frozen=True)
class QueueBacklog:
    """One PGMQ queue's backlog: the numbers of ``pgmq.metrics()``, counted from the queue's table.

    Attributes:
        flow_slug: the flow using the queue; None when no flow does.
        queue_name: the queue as PGMQ lists it (pgmq.meta).
        aliases: other meta names of the same physical table (names equal ignoring case), usually none.
        origin: ``default`` (a plain flow's queue), ``step`` (a private step queue) or ``none``.
        messages: messages in the queue (visible or not); None when its table is missing or unreadable.
        visible: messages readable now (None as above).
        oldest_message_age_seconds / newest_message_age_seconds: whole seconds, None when empty.
    """

    flow_slug: str | None
    queue_name: str
    aliases: list[str]
    origin: str
    messages: int | None
    visible: int | None
    oldest_message_age_seconds: int | None
    newest_message_age_seconds: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FlowStatus:
    """One flow's line of ``pgflow status``.

    Attributes:
        flow_slug: the flow.
        runs: run state -> count, every state of :data:`RUN_STATES` present (0 when none).
        tasks: task state -> count, every state of :data:`TASK_STATES` present.
        oldest_queued: the longest-waiting queued task, None when nothing is queued.
        stalled: tasks the next ``requeue_stalled_tasks()`` call would requeue or give up on; None
            where the schema has no stalled recovery (upstream-installed: not analysed).
        permanently_stalled: started tasks stalled recovery gave up on (nobody will finish them); None as above.
        stalled_by_step: ``{step_slug: (stalled, permanently_stalled)}`` for the steps with started
            tasks (the same counts per step; empty where stalled counts are unknown).
        oldest_stalled_started_at: claim time of the oldest stalled task, None when none.
        workers: ``live``, ``deprecated`` (told to stop, still heartbeating), ``stale`` (no heartbeat
            within the window, not stopped) -> count of worker rows; None where the schema's worker rows
            carry no route (upstream-installed: not analysed).
        queues: the flow's queues with their backlog.
        waiting: tasks of manual steps waiting for their outcome (counted in ``tasks["started"]``, but
            nobody runs them); None where the schema has no manual tasks.
    """

    flow_slug: str
    runs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RUN_STATES, 0))
    tasks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TASK_STATES, 0))
    oldest_queued: OldestQueued | None = None
    stalled: int | None = None
    permanently_stalled: int | None = None
    oldest_stalled_started_at: dt.datetime | None = None
    stalled_by_step: dict[str, tuple[int, int]] = field(default_factory=dict)
    workers: dict[str, int] | None = None
    queues: list[QueueBacklog] = field(default_factory=list)
    waiting: int | None = None

    @property
    def running(self) -> int:
        """Started tasks a worker runs: the started ones but manual tasks waiting for their outcome."""
        return self.tasks.get("started", 0) - (self.waiting or 0)

    @property
    def runs_in_flight(self) -> int:
        """Runs still ``started``."""
        return self.runs.get("started", 0)

    @property
    def backlog(self) -> int:
        """Messages in all of the flow's queues."""
        return sum(q.messages or 0 for q in self.queues)

    def to_dict(self) -> dict[str, Any]:
        return {
            "flow_slug": self.flow_slug,
            "runs": dict(self.runs),
            "runs_in_flight": self.runs_in_flight,
            "tasks": dict(self.tasks),
            "waiting_manual_tasks": self.waiting,
            "oldest_queued_task": self.oldest_queued.to_dict() if self.oldest_queued else None,
            "stalled_tasks": self.stalled,
            "permanently_stalled_tasks": self.permanently_stalled,
            "oldest_stalled_started_at": utc_iso(self.oldest_stalled_started_at),
            "workers": dict(self.workers) if self.workers is not None else None,
            "backlog": self.backlog,
            "queues": [q.to_dict() for q in self.queues],
        }


@dataclass
class StatusReport:
    """What ``pgflow status`` shows: one snapshot of every (or one) flow.

    Attributes:
        checked_at: the server's clock at the snapshot.
        flows: per flow, in slug order.
        other_queues: PGMQ queues no flow uses (only without a flow filter).
        flow_filter: the ``--flow`` given, or None.
        heartbeat_window: seconds; the worker liveness window.
        stalled_recovery: the schema has ``requeue_stalled_tasks`` (stalled counts are known).
    """

    checked_at: dt.datetime
    flows: list[FlowStatus]
    other_queues: list[QueueBacklog]
    flow_filter: str | None
    heartbeat_window: float
    stalled_recovery: bool = True

    @property
    def runs_in_flight(self) -> int:
        """Runs still ``started`` over all flows shown."""
        return sum(f.runs_in_flight for f in self.flows)

    def totals(self) -> dict[str, int]:
        """Sums over the flows shown: runs in flight, queued and stalled tasks, backlog, live workers."""
        return {
            "flows": len(self.flows),
            "runs_in_flight": self.runs_in_flight,
            "queued_tasks": sum(f.tasks.get("queued", 0) for f in self.flows),
            "started_tasks": sum(f.tasks.get("started", 0) for f in self.flows),
            "waiting_manual_tasks": sum(f.waiting or 0 for f in self.flows),
            "failed_runs": sum(f.runs.get("failed", 0) for f in self.flows),
            "stale_workers": sum(f.workers["stale"] for f in self.flows if f.workers),
            "stalled_tasks": sum(f.stalled or 0 for f in self.flows),
            "permanently_stalled_tasks": sum(f.permanently_stalled or 0 for f in self.flows),
            "backlog": sum(f.backlog for f in self.flows),
            "live_workers": sum(f.workers["live"] for f in self.flows if f.workers),
        }

    def to_document(self) -> dict[str, Any]:
        """The versioned JSON document (docs/schemas/status.schema.json)."""
        return {
            "kind": DOCUMENT_KIND,
            "version": DOCUMENT_VERSION,
            "checked_at": utc_iso(self.checked_at),
            "flow_filter": self.flow_filter,
            "stalled_recovery": self.stalled_recovery,
            "heartbeat_window_seconds": self.heartbeat_window,
            "totals": self.totals(),
            "flows": [f.to_dict() for f in self.flows],
            "other_queues": [q.to_dict() for q in self.other_queues],
        }


def collect(
    conn: psycopg.Connection,
    flow: str | None = None,
    *,
    heartbeat_window: float = DEFAULT_HEARTBEAT_WINDOW,
    statement_timeout: float | None = 60.0,
) -> StatusReport:
    """Read one snapshot of what runs, in a READ ONLY, REPEATABLE READ transaction.

    Args:
        conn: an autocommit connection (:func:`pgflow_cli.db.connect`).
        flow: one exact flow slug, or None for every flow.
        heartbeat_window: seconds; a worker is live when its last heartbeat is at most this old.
        statement_timeout: seconds each statement may run (None: no limit).

    Returns:
        The :class:`StatusReport`.

    Raises:
        StateConflict: ``flow`` names no flow (exit 6).
        psycopg.Error: anything from the server, e.g. no pgflow schema (the CLI maps it, exit 3).
    """
    params = {"flow": flow, "heartbeat_window": float(heartbeat_window)}

    def rows(name: str) -> list[dict[str, Any]]:
        with conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(sqlfiles.statement(QUERIES, name), params).fetchall()

    with transaction(conn, read_only=True, isolation="repeatable read", statement_timeout=statement_timeout):
        checked_at = scalar(conn.execute(sqlfiles.statement(QUERIES, "now")))
        flows = {row["flow_slug"]: FlowStatus(row["flow_slug"]) for row in rows("flows")}
        if flow is not None and flow not in flows:
            raise StateConflict(f"no flow named {names.unknown_flows(conn, [flow])}",
                                hint="flow slugs are exact and case-sensitive; `pgflow status` lists every flow")
        capabilities = rows("capabilities")[0]
        for row in rows("runs_by_state"):
            flows[row["flow_slug"]].runs[row["status"]] = row["runs"]
        for row in rows("tasks_by_state"):
            flows[row["flow_slug"]].tasks[row["status"]] = row["tasks"]
        for row in rows("oldest_queued"):
            slug = row.pop("flow_slug")
            flows[slug].oldest_queued = OldestQueued(**{**row, "run_id": str(row["run_id"])})
        if capabilities["manual_tasks"]:
            for flow_status in flows.values():
                flow_status.waiting = 0
            for row in rows("manual_waiting"):
                flows[row["flow_slug"]].waiting = row["waiting"]
        stalled_rule = "stalled" if capabilities["manual_tasks"] else "stalled_before_manual_tasks"
        for flow_status in flows.values() if capabilities["stalled_recovery"] else ():
            flow_status.stalled = flow_status.permanently_stalled = 0
        for row in rows(stalled_rule) if capabilities["stalled_recovery"] else ():
            entry = flows[row["flow_slug"]]
            entry.stalled_by_step[row["step_slug"]] = (row["stalled"], row["permanently_stalled"])
            entry.stalled = (entry.stalled or 0) + row["stalled"]
            entry.permanently_stalled = (entry.permanently_stalled or 0) + row["permanently_stalled"]
            oldest = row["oldest_stalled_started_at"]
            if oldest is not None and (entry.oldest_stalled_started_at is None or oldest < entry.oldest_stalled_started_at):
                entry.oldest_stalled_started_at = oldest
        other: list[QueueBacklog] = []
        for row in rows("queues"):
            queue = QueueBacklog(**{**row, "aliases": list(row["aliases"] or [])})
            (flows[queue.flow_slug].queues if queue.flow_slug in flows else other).append(queue)
        for flow_status in flows.values() if capabilities["worker_routes"] else ():
            flow_status.workers = {"live": 0, "deprecated": 0, "stale": 0}
        for row in rows("workers") if capabilities["worker_routes"] else ():
            if row["flow_slug"] in flows:
                flows[row["flow_slug"]].workers = {k: row[k] for k in ("live", "deprecated", "stale")}
    return StatusReport(checked_at, list(flows.values()), other, flow, float(heartbeat_window),
                        bool(capabilities["stalled_recovery"]))

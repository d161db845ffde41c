"""``pgflow runs list`` and ``pgflow runs show``: runs, their steps, tasks, attempts and errors.

Read-only (SELECT on the pgflow tables, ``sql/queries/runs.sql``), on every schema level from the
protocol-1 baseline on. Run inputs and PGMQ message bodies are never read; step and task outputs
only when asked for (``--show-output``). docs/commands/runs.md.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgflow_cli import sqlfiles
from pgflow_cli.db import scalar, transaction
from pgflow_cli.errors import StateConflict, UsageError
from pgflow_cli.operations.status import RUN_STATES, utc_iso

QUERIES = "queries/runs.sql"

LIST_KIND = "pgflow-cli/runs-list"
SHOW_KIND = "pgflow-cli/runs-show"
DOCUMENT_VERSION = 1

MAX_LIMIT = 1000
"""Largest page of ``runs list``."""


def parse_run_id(text: str, what: str = "RUN_ID") -> str:
    """The canonical text of a run id, or :class:`UsageError` (exit 2) naming what was wrong."""
    try:
        return str(uuid.UUID(text.strip()))
    except ValueError:
        raise UsageError(f"{what} {text!r} is not a run id (a UUID such as 6f1c2a9e-8d3b-4c5e-9f10-2a3b4c5d6e7f)",
                         hint="`pgflow runs list` shows the run ids") from None


def _timestamps(row: dict[str, Any]) -> dict[str, Any]:
    return {k: utc_iso(v) if isinstance(v, dt.datetime) else v for k, v in row.items()}


@dataclass(frozen=True)
class RunSummary:
    """One row of ``runs list``: a run, its state and times, how many of its steps failed.

    Timestamps are timezone-aware; ``completed_at``/``failed_at`` are None until the run ends.
    """

    run_id: str
    flow_slug: str
    status: str
    started_at: dt.datetime
    completed_at: dt.datetime | None
    failed_at: dt.datetime | None
    remaining_steps: int
    steps: int
    failed_steps: int

    def to_dict(self) -> dict[str, Any]:
        return _timestamps(dict(self.__dict__))


@dataclass
class RunPage:
    """A page of ``runs list``, newest first; ``next_before`` is the ``--before`` of the next page (None: last page)."""

    runs: list[RunSummary]
    flow: str | None
    status: str | None
    limit: int
    before: str | None
    next_before: str | None

    def to_document(self) -> dict[str, Any]:
        """The versioned JSON document (docs/schemas/runs-list.schema.json)."""
        return {
            "kind": LIST_KIND, "version": DOCUMENT_VERSION,
            "filter": {"flow": self.flow, "status": self.status, "before": self.before, "limit": self.limit},
            "runs": [r.to_dict() for r in self.runs],
            "next_before": self.next_before,
        }


def list_runs(
    conn: psycopg.Connection,
    *,
    flow: str | None = None,
    status: str | None = None,
    limit: int = 20,
    before: str | None = None,
) -> RunPage:
    """Runs newest first (by ``started_at``, then id), at most ``limit``, in one read-only transaction.

    Args:
        conn: an autocommit connection.
        flow: exact flow slug, or None for every flow.
        status: one of :data:`RUN_STATES`, or None.
        limit: page size, 1..:data:`MAX_LIMIT`.
        before: a run id: only runs that sort after it (started earlier); the previous page's ``next_before``.

    Raises:
        UsageError: a bad status, limit or ``before`` (exit 2).
        StateConflict: ``flow`` or ``before`` names nothing (exit 6).
    """
    if status is not None and status not in RUN_STATES:
        raise UsageError(f"unknown run status {status!r}", hint="choose from: " + ", ".join(RUN_STATES))
    if not 1 <= limit <= MAX_LIMIT:
        raise UsageError(f"--limit must be between 1 and {MAX_LIMIT}, got {limit}")
    before_id = parse_run_id(before, "--before") if before is not None else None
    params = {"flow": flow, "status": status, "limit": limit, "before": before_id}
    with transaction(conn, read_only=True, isolation="repeatable read"):
        if flow is not None and not scalar(conn.execute(sqlfiles.statement(QUERIES, "flow_exists"), params)):
            raise StateConflict(f"no flow named {flow!r}", hint="flow slugs are exact and case-sensitive")
        if before_id is not None and not scalar(conn.execute(sqlfiles.statement(QUERIES, "run_exists"),
                                                             {"run_id": before_id})):
            raise StateConflict(f"no run {before_id} (the --before run)", hint="pass a run id that `runs list` showed")
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(sqlfiles.statement(QUERIES, "list"), params).fetchall()
    runs = [RunSummary(**{**row, "run_id": str(row["run_id"])}) for row in rows[:limit]]
    next_before = runs[-1].run_id if len(rows) > limit else None
    return RunPage(runs, flow, status, limit, before_id, next_before)


@dataclass
class RunDetail:
    """``runs show``: one run, its steps and its tasks (attempts, errors; outputs only when asked).

    Attributes:
        run: the run's columns (no input; ``output`` only with outputs shown).
        steps: per step in definition order: state, task counts, error, times, max attempts, timeout.
        tasks: per task: state, attempts used, requeues, last error, message id (never the body), times.
        tasks_total: how many tasks the run has (``tasks`` holds at most ``max_tasks`` of them).
        show_output: whether outputs were read.
    """

    run: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    tasks: list[dict[str, Any]] = field(default_factory=list)
    tasks_total: int = 0
    show_output: bool = False

    def to_document(self) -> dict[str, Any]:
        """The versioned JSON document (docs/schemas/runs-show.schema.json)."""
        return {
            "kind": SHOW_KIND, "version": DOCUMENT_VERSION,
            "show_output": self.show_output,
            "run": _timestamps(self.run),
            "steps": [_timestamps(s) for s in self.steps],
            "tasks": [_timestamps(t) for t in self.tasks],
            "tasks_total": self.tasks_total,
            "tasks_shown": len(self.tasks),
        }


def show_run(conn: psycopg.Connection, run_id: str, *, show_output: bool = False, max_tasks: int = 200) -> RunDetail:
    """Read one run with its steps and tasks in one read-only snapshot.

    Args:
        conn: an autocommit connection.
        run_id: the run's UUID (text; checked here).
        show_output: also read the run's, steps' and tasks' outputs.
        max_tasks: at most this many tasks (by step order, then index).

    Raises:
        UsageError: ``run_id`` is not a UUID, or ``max_tasks`` < 1 (exit 2).
        StateConflict: no such run (exit 6).
    """
    canonical = parse_run_id(run_id)
    if max_tasks < 1:
        raise UsageError(f"--max-tasks must be at least 1, got {max_tasks}")
    params = {"run_id": canonical, "show_output": show_output, "max_tasks": max_tasks}
    with transaction(conn, read_only=True, isolation="repeatable read"), conn.cursor(row_factory=dict_row) as cur:
        run = cur.execute(sqlfiles.statement(QUERIES, "run"), params).fetchone()
        if run is None:
            raise StateConflict(f"no run {canonical}", hint="`pgflow runs list` shows the run ids")
        steps = cur.execute(sqlfiles.statement(QUERIES, "steps"), params).fetchall()
        tasks = cur.execute(sqlfiles.statement(QUERIES, "tasks"), params).fetchall()
    total = tasks[0]["total"] if tasks else 0
    for task in tasks:
        del task["total"]
        for key in ("last_worker_id",):
            task[key] = str(task[key]) if task[key] is not None else None
    if not show_output:
        for item in (run, *steps, *tasks):
            item.pop("output", None)
    return RunDetail({**run, "run_id": str(run["run_id"])}, steps, tasks, total, show_output)

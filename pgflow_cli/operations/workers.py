"""``pgflow workers list`` / ``pgflow workers forget``: the worker rows, and deleting those long dead
(docs/commands/workers.md).

A worker that was killed (``kill -9``, a lost host) never marks its row stopped: ``pgflow status``
and ``pgflow coverage`` then show it as stale until someone deletes the row. ``forget`` deletes the
rows without a heartbeat for a given time that hold no task in flight, in one transaction: the rows
are locked first (a worker that heartbeats meanwhile is left alone, and no claim can name a locked
worker), then deleted by a statement that sees every task claimed before the locks.

The SQL is ``sql/queries/workers.sql``; liveness and route attribution are the fragments of
``pgflow status`` and ``pgflow coverage``. Runs on every schema level from the baseline on.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgflow_cli import sqlfiles
from pgflow_cli.db import transaction
from pgflow_cli.errors import UsageError
from pgflow_cli.operations.coverage import DEFAULT_HEARTBEAT_WINDOW

QUERIES = "queries/workers.sql"

LIST_KIND = "pgflow-cli/workers-list"
FORGET_KIND = "pgflow-cli/workers-forget"
DOCUMENT_VERSION = 1

STATES = ("stale", "draining", "live", "stopped")
"""Worker row states, in the order ``list`` shows them (those needing a look first)."""

MIN_STALE_FOR = 60.0
"""Seconds: ``forget`` refuses a shorter ``--stale-for``. A worker heartbeats every few seconds; a
minute without one is already far outside any heartbeat window, so a busy host or a short network
hiccup never gets a live worker's row deleted."""


@dataclass(frozen=True)
class WorkerRow:
    """One row of ``pgflow.workers`` as ``list`` shows it.

    Attributes:
        worker_id: the worker's id (UUID text).
        function_name: the worker function it registered under (the fence acts on it).
        flow_slug / step_slug: the flow (and step, for a step worker) it registered; None when none.
        queue_name: the queue it polls.
        worker_version: what it reported at registration; None where not reported or not recorded.
        state: ``stale`` (not stopped, no heartbeat within the window), ``draining`` (told to stop,
            still heartbeating), ``live`` or ``stopped``.
        started_at / last_heartbeat_at / stopped_at: timezone-aware timestamps (stopped_at None unless stopped).
        heartbeat_age_seconds: seconds since the last heartbeat.
        tasks_in_flight: started tasks it claimed last that stalled recovery has not given up on.
        serves: the routes it serves, ``flow`` or ``flow/step`` (the rule of status and coverage).
    """

    worker_id: str
    function_name: str
    flow_slug: str | None
    step_slug: str | None
    queue_name: str
    worker_version: str | None
    state: str
    started_at: dt.datetime
    last_heartbeat_at: dt.datetime
    stopped_at: dt.datetime | None
    heartbeat_age_seconds: float
    tasks_in_flight: int
    serves: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ForgetReport:
    """What ``forget`` deleted (or, with ``dry_run``, would delete).

    Attributes:
        stale_for: the ``--stale-for`` seconds.
        candidates: rows without a heartbeat for ``stale_for`` seconds (within the flow filter).
        forgotten: ids of the rows deleted (with ``dry_run``: those that would be).
        dry_run: nothing was deleted.
    """

    stale_for: float
    candidates: list[WorkerRow]
    forgotten: list[str]
    dry_run: bool

    @property
    def kept(self) -> list[WorkerRow]:
        """Candidates left in place: a task in flight, or a heartbeat while ``forget`` ran."""
        return [w for w in self.candidates if w.worker_id not in set(self.forgotten)]

    def to_document(self) -> dict[str, Any]:
        """The versioned JSON document (docs/schemas/workers-forget.schema.json)."""
        return {"kind": FORGET_KIND, "version": DOCUMENT_VERSION, "dry_run": self.dry_run,
                "stale_for_seconds": self.stale_for, "forgotten": self.forgotten,
                "kept": [{"worker_id": w.worker_id, "tasks_in_flight": w.tasks_in_flight} for w in self.kept],
                "workers": [w.to_dict() for w in self.candidates]}


def list_document(rows: list[WorkerRow], heartbeat_window: float) -> dict[str, Any]:
    """The versioned JSON document of ``list`` (docs/schemas/workers-list.schema.json)."""
    counts = {state: sum(1 for r in rows if r.state == state) for state in STATES}
    return {"kind": LIST_KIND, "version": DOCUMENT_VERSION, "heartbeat_window_seconds": heartbeat_window,
            "counts": counts, "workers": [r.to_dict() for r in rows]}


def _rows(conn: psycopg.Connection, params: dict[str, Any]) -> list[WorkerRow]:
    with conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute(sqlfiles.statement(QUERIES, "list"), params).fetchall()
    return [WorkerRow(**{**row, "worker_id": str(row["worker_id"]), "serves": list(row["serves"])}) for row in found]


def list_workers(conn: psycopg.Connection, *, flow: str | None = None, stale_for: float | None = None,
                 heartbeat_window: float = DEFAULT_HEARTBEAT_WINDOW) -> list[WorkerRow]:
    """Every worker row (or those of one flow, or those silent for ``stale_for`` seconds), read-only.

    Args:
        conn: an autocommit connection.
        flow: an exact flow slug: rows that registered it or serve one of its routes; None for all.
        stale_for: seconds: only rows without a heartbeat for at least that long; None for all.
        heartbeat_window: seconds; a worker is live when its last heartbeat is at most this old.

    Returns:
        The rows, stale first, then draining, live and stopped, oldest heartbeat first.
    """
    params = {"flow": flow, "stale_for": stale_for, "heartbeat_window": float(heartbeat_window)}
    with transaction(conn, read_only=True, isolation="repeatable read"):
        return _rows(conn, params)


def forget(conn: psycopg.Connection, *, stale_for: float, flow: str | None = None, dry_run: bool = False,
           only: list[str] | None = None, heartbeat_window: float = DEFAULT_HEARTBEAT_WINDOW,
           lock_timeout: float = 5.0) -> ForgetReport:
    """Delete the rows of workers without a heartbeat for ``stale_for`` seconds that hold no task in
    flight, in one transaction.

    Args:
        conn: an autocommit connection.
        stale_for: seconds without a heartbeat (stopped rows included); at least :data:`MIN_STALE_FOR`.
        flow: an exact flow slug to limit it to (as :func:`list_workers`), or None.
        dry_run: report what would be deleted and roll back.
        only: worker ids: delete none but these (the rows a person confirmed after a dry run), or None.
        heartbeat_window: seconds, only for the states shown.
        lock_timeout: seconds to wait for a row a worker holds (a claim naming it, a heartbeat).

    Returns:
        The :class:`ForgetReport`.

    Raises:
        UsageError: ``stale_for`` below :data:`MIN_STALE_FOR` (exit 2).
        psycopg.Error: from the server (a lock timeout is exit 4 through the CLI's mapping).
    """
    if stale_for < MIN_STALE_FOR:
        raise UsageError(f"--stale-for must be at least {MIN_STALE_FOR:g} seconds, got {stale_for:g}",
                         hint="a live worker may miss a few heartbeats; forget only rows silent for minutes or more")
    params = {"flow": flow, "stale_for": float(stale_for), "heartbeat_window": float(heartbeat_window)}
    with transaction(conn, lock_timeout=lock_timeout):
        candidates = [w for w in _rows(conn, params) if only is None or w.worker_id in only]
        ids = [w.worker_id for w in candidates]
        locked = [str(r[0]) for r in conn.execute(sqlfiles.statement(QUERIES, "lock_forgettable"),
                                                  {**params, "worker_ids": ids}).fetchall()]
        deleted = {str(r[0]) for r in conn.execute(sqlfiles.statement(QUERIES, "forget"),
                                                   {"worker_ids": locked}).fetchall()}
        report = ForgetReport(stale_for, candidates, [i for i in ids if i in deleted], dry_run)
        if dry_run:
            raise psycopg.Rollback()  # leaves the block, rolled back
    return report

"""The rollout fence: disable worker functions, drain their work, restore exactly what was recorded.

Spec: "Required rollout documentation" and "Production rollout"; runbook: docs/rollout.md.

The fence acts on ``pgflow.worker_functions.enabled``. While a function is disabled its workers
refuse to register (``PF001``), so a process supervisor cannot restart old code, and the HTTP
starter (``pgflow.ensure_workers``) never pings it. The database keeps the record
(``pgflow.fences``, one row per function and fence: the value found, the value written, reason,
who, when), written and read back by ``pgflow.fence_disable`` / ``pgflow.fence_restore`` under
the function rows' locks. Restore is a compare-and-set: a row that anybody changed since the
fence is a conflict and left alone, and a pause set by a fatal claim is never lifted.

Liveness: a worker is *live* when it has not stopped and its last heartbeat is younger than the
heartbeat window. A started task is *in flight* while the worker holding it heartbeats within the
window; after that it is *stranded* (its worker died or gave up on it): it no longer blocks the
drain, and stalled recovery requeues it at ``recovery_at``. The drain is complete when no worker
of the fenced functions is live and no task of theirs is in flight.

Everything here returns dataclasses and raises :mod:`pgflow_cli.errors` types; nothing prints.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgflow_cli import db, sqlfiles
from pgflow_cli.errors import DeadlineReached, SchemaMissing, StateConflict, UsageError

QUERIES = "queries/fence.sql"

DEFAULT_WINDOW = 15.0
"""Seconds without a heartbeat after which a worker counts as gone (3 reference-worker heartbeats)."""
DEFAULT_DRAIN_TIMEOUT = 600.0
"""Seconds ``fence disable`` waits for the drain before exit 5."""
DEFAULT_HEARTBEAT_TIMEOUT = 300.0
"""Seconds ``fence restore --wait-heartbeat`` waits for new workers before exit 5."""
TASK_LIST_LIMIT = 50
"""Started tasks listed one by one (all are counted per step)."""
MAX_REASON = 1000
"""Characters of ``-m REASON`` the database keeps."""


# ----------------------------------------------------------------------------------------------
# results
# ----------------------------------------------------------------------------------------------
def _rows_to(cls: Any, rows: Iterable[dict[str, Any]]) -> list[Any]:
    names = set(cls.__dataclass_fields__)
    return [cls(**{k: v for k, v in row.items() if k in names}) for row in rows]


@dataclass(frozen=True)
class Route:
    """A route a function's workers served: flow, step (``None`` for a whole-flow worker), queue."""

    function_name: str
    flow_slug: str
    step_slug: str | None
    queue_name: str


@dataclass(frozen=True)
class Selection:
    """The worker functions a fence command acts on.

    Attributes:
        functions: distinct names, sorted.
        requested_flows: the ``--flow`` slugs given.
        routes: every route the functions' workers served (a function can serve several flows).
    """

    functions: list[str]
    requested_flows: list[str] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)

    def flows_of(self, function_name: str) -> list[str]:
        """Flows the function's workers served, sorted."""
        return sorted({r.flow_slug for r in self.routes if r.function_name == function_name})

    def to_dict(self) -> dict[str, Any]:
        return {"functions": self.functions, "flows": self.requested_flows,
                "routes": [asdict(r) for r in self.routes]}


@dataclass(frozen=True)
class Worker:
    """A worker row: ``heartbeat_age`` in seconds since its last heartbeat."""

    worker_id: Any
    function_name: str
    flow_slug: str | None
    step_slug: str | None
    queue_name: str
    heartbeat_age: float
    deprecated: bool = True

    def label(self) -> str:
        """``worker <id> (function, flow[/step], heartbeat N s ago)``."""
        where = self.flow_slug or "-"
        if self.step_slug:
            where += f"/{self.step_slug}"
        return f"worker {self.worker_id} ({self.function_name}, {where}, heartbeat {self.heartbeat_age:.1f} s ago)"


@dataclass(frozen=True)
class StartedTask:
    """A started task of a fenced function's worker. ``in_flight``: its worker still heartbeats."""

    flow_slug: str
    step_slug: str
    run_id: Any
    task_index: int
    queue_name: str
    message_id: int | None
    attempts_count: int
    worker_id: Any
    function_name: str
    started_seconds_ago: float
    in_flight: bool
    recovery_at: dt.datetime | None

    def label(self) -> str:
        """``task <flow>/<step>[index] of run <id> (queue, message, worker, started N s ago)``."""
        state = "in flight" if self.in_flight else f"stranded, stalled recovery requeues it at {self.recovery_at:%H:%M:%S}"
        return (f"task {self.flow_slug}/{self.step_slug}[{self.task_index}] of run {self.run_id} "
                f"(queue {self.queue_name}, message {self.message_id}, worker {self.worker_id}, "
                f"started {self.started_seconds_ago:.0f} s ago, {state})")


@dataclass(frozen=True)
class StepLoad:
    """Started tasks of one function's workers in one flow step: ``in_flight`` and ``stranded``
    counts, oldest age in seconds."""

    function_name: str
    flow_slug: str
    step_slug: str
    in_flight: int
    stranded: int
    oldest_seconds: float


@dataclass(frozen=True)
class Backlog:
    """Queued tasks of one route the functions serve (the replacement workers' first work)."""

    flow_slug: str
    step_slug: str
    queue_name: str
    queued: int
    oldest_seconds: float


@dataclass
class DrainProgress:
    """One look at what the fenced functions still run.

    Attributes:
        functions: the functions watched.
        window: heartbeat window, seconds.
        workers: live workers (not stopped, heartbeat within the window).
        steps: started tasks per step (in flight and stranded).
        tasks: started tasks one by one, in-flight first, at most ``TASK_LIST_LIMIT``.
        backlog: queued tasks per route.
        elapsed: seconds since the wait began (0 for a single look).
    """

    functions: list[str]
    window: float
    workers: list[Worker]
    steps: list[StepLoad]
    tasks: list[StartedTask]
    backlog: list[Backlog]
    elapsed: float = 0.0

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in self.steps)

    @property
    def stranded(self) -> int:
        return sum(s.stranded for s in self.steps)

    @property
    def queued(self) -> int:
        return sum(b.queued for b in self.backlog)

    @property
    def drained(self) -> bool:
        """No live worker and no task in flight."""
        return not self.workers and self.in_flight == 0

    def state(self) -> str:
        return "drained" if self.drained else "draining"

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state(), "functions": self.functions, "heartbeat_window_seconds": self.window,
            "elapsed_seconds": round(self.elapsed, 3), "live_workers": [asdict(w) for w in self.workers],
            "tasks_in_flight": self.in_flight, "tasks_stranded": self.stranded, "queued": self.queued,
            "started_by_step": [asdict(s) for s in self.steps], "started_tasks": [asdict(t) for t in self.tasks],
            "backlog": [asdict(b) for b in self.backlog],
        }


@dataclass(frozen=True)
class FenceChange:
    """One function's row from ``fence_disable`` or ``fence_restore``.

    ``action``: disable: ``fenced`` / ``already_fenced``; restore: ``restored`` /
    ``kept_disabled`` / ``conflict``. ``detail``: why (restore).
    """

    function_name: str
    action: str
    previous_enabled: bool | None
    enabled: bool | None
    fence_id: int | None
    fenced_at: dt.datetime | None
    fenced_by: str | None
    fence_reason: str | None
    paused_reason: str | None = None
    workers_deprecated: int = 0
    closed_at: dt.datetime | None = None
    detail: str | None = None


@dataclass
class DisableResult:
    """What ``fence disable`` did (or would do, ``dry_run``), and the drain it watched."""

    selection: Selection
    changes: list[FenceChange]
    deprecated: list[Worker]
    dry_run: bool = False
    drain: DrainProgress | None = None
    outcome: str = "fenced"
    """``dry_run``, ``detached``, ``drained``, ``timeout`` or ``interrupted``."""

    def to_document(self) -> dict[str, Any]:
        return {
            "kind": "pgflow-cli/fence-disable", "version": 1, "dry_run": self.dry_run, "outcome": self.outcome,
            "selection": self.selection.to_dict(),
            "functions": [{**asdict(c), "flows": self.selection.flows_of(c.function_name)} for c in self.changes],
            "workers_deprecated": [asdict(w) for w in self.deprecated],
            "drain": self.drain.to_dict() if self.drain else None,
        }


@dataclass
class RestoreResult:
    """What ``fence restore`` did, and the heartbeats it waited for."""

    selection: Selection
    changes: list[FenceChange]
    dry_run: bool = False
    new_workers: list[Worker] = field(default_factory=list)
    waiting_for: list[str] = field(default_factory=list)
    outcome: str = "restored"
    """``dry_run``, ``restored``, ``conflict``, ``confirmed``, ``timeout`` or ``interrupted``."""

    @property
    def conflicts(self) -> list[FenceChange]:
        return [c for c in self.changes if c.action == "conflict"]

    @property
    def enabled_again(self) -> list[str]:
        """Functions this restore enabled (the ones that need a new worker)."""
        return [c.function_name for c in self.changes if c.action == "restored"]

    def conflict_error(self) -> StateConflict | None:
        """The exit-6 error naming every conflicting row, or ``None``."""
        if not self.conflicts:
            return None
        verb = "would be" if self.dry_run else "were"
        return StateConflict(
            f"{len(self.conflicts)} fenced function(s) {verb} left alone: changed since the fence",
            hint="nobody's change was overwritten. Decide per function: enable it yourself "
            "(UPDATE pgflow.worker_functions SET enabled = true WHERE function_name = '...') once it is safe; "
            "for a fatal pause fix the cause first (docs/claim-protocol.md)",
            detail=[f"{c.function_name}: {c.detail}" for c in self.conflicts],
        )

    def to_document(self) -> dict[str, Any]:
        return {
            "kind": "pgflow-cli/fence-restore", "version": 1, "dry_run": self.dry_run, "outcome": self.outcome,
            "selection": self.selection.to_dict(), "functions": [asdict(c) for c in self.changes],
            "new_workers": [asdict(w) for w in self.new_workers], "waiting_for": self.waiting_for,
        }


@dataclass(frozen=True)
class ActiveFence:
    """An active fence and its function row as it is now. ``holds``: a restore would succeed."""

    fence_id: int
    function_name: str
    previous_enabled: bool
    written_enabled: bool
    reason: str
    fenced_at: dt.datetime
    fenced_by: str
    fenced_application: str | None
    fenced_client: str | None
    workers_deprecated: int
    age_seconds: float
    enabled: bool | None
    paused_reason: str | None
    holds: bool

    def restore_outlook(self) -> str:
        """What ``fence restore`` would do now, in words."""
        if not self.holds:
            return "conflict: the function row changed since the fence"
        if self.previous_enabled and self.paused_reason:
            return "conflict: a fatal claim paused the function"
        return "enable again" if self.previous_enabled else "keep disabled (was disabled before)"


@dataclass
class StatusReport:
    """``fence status``: the active fences and the drain of their functions."""

    fences: list[ActiveFence]
    drain: DrainProgress | None

    def to_document(self) -> dict[str, Any]:
        return {
            "kind": "pgflow-cli/fence-status", "version": 1,
            "fences": [{**asdict(f), "restore_outlook": f.restore_outlook()} for f in self.fences],
            "drain": self.drain.to_dict() if self.drain else None,
        }


# ----------------------------------------------------------------------------------------------
# selection
# ----------------------------------------------------------------------------------------------
def _sql(name: str) -> str:
    return sqlfiles.statement(QUERIES, name)


def _fetch(conn: psycopg.Connection, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(_sql(name), params or {}).fetchall()


def require_installed(conn: psycopg.Connection) -> None:
    """Raise :class:`SchemaMissing` (exit 3) unless the database has the fence (migration 0003)."""
    rows = _fetch(conn, "installed")
    if not rows or not rows[0]["installed"]:
        raise SchemaMissing(
            "this database has no rollout-fence record (pgflow.fences, migration 0003)",
            hint="upgrade the schema with `pgflow migrate apply`; while you upgrade from an older schema, fence with "
            "the SQL of docs/upgrade.md step 2",
        )


def select(conn: psycopg.Connection, functions: Sequence[str] = (), flows: Sequence[str] = (), *,
           every: bool = False) -> Selection:
    """Resolve ``--function`` names and ``--flow`` slugs (or ``--all``) into the functions to act on.

    A flow selects every worker function whose workers (stopped ones included) served one of the
    flow's current routes. ``every`` selects every row of ``pgflow.worker_functions`` (an upgrade
    that changes the worker protocol fences them all).

    Raises:
        UsageError: nothing named, an empty name, or ``every`` with names.
        StateConflict: a flow that does not exist, one no worker has ever served, or no worker
            function at all (exit 6).
    """
    if every:
        if functions or flows:
            raise UsageError("--all selects every worker function; leave out --function and --flow")
        chosen = [r["function_name"] for r in _fetch(conn, "all_functions")]
        if not chosen:
            raise StateConflict("there is no worker function to fence (pgflow.worker_functions is empty)",
                                hint="a function appears once one of its workers registered")
        return Selection(chosen, [], _rows_to(Route, _fetch(conn, "routes_of_functions", {"functions": chosen})))
    names = set()
    for name in functions:
        if not name or not name.strip():
            raise UsageError("--function needs a worker function name")
        names.add(name)
    flow_list = sorted(set(flows))
    if not names and not flow_list:
        raise UsageError("name what to fence: --function NAME (repeatable) and/or --flow SLUG")
    if flow_list:
        known = {r["flow_slug"] for r in _fetch(conn, "known_flows", {"flows": flow_list})}
        unknown = [f for f in flow_list if f not in known]
        if unknown:
            raise StateConflict(f"flow not found: {', '.join(unknown)}",
                                hint="flow slugs are exact and case-sensitive: SELECT flow_slug FROM pgflow.flows")
        served = _fetch(conn, "functions_for_flows", {"flows": flow_list})
        unserved = [f for f in flow_list if f not in {r["flow_slug"] for r in served}]
        if unserved:
            raise StateConflict(
                f"no worker has registered for flow(s) {', '.join(unserved)}, so no worker function is known to serve them",
                hint="name the functions with --function (SELECT function_name FROM pgflow.worker_functions)")
        names.update(r["function_name"] for r in served)
    chosen = sorted(names)
    routes = _rows_to(Route, _fetch(conn, "routes_of_functions", {"functions": chosen}))
    return Selection(chosen, flow_list, routes)


def restore_selection(conn: psycopg.Connection, functions: Sequence[str], flows: Sequence[str],
                       every: bool) -> Selection | None:
    """Resolve what ``fence restore`` acts on; ``None`` means every active fence (``--all``).

    A ``--flow`` keeps only the functions serving it that have an active fence; ``--function``
    names are kept as given (one without a fence makes the restore refuse, exit 6).

    Raises:
        UsageError: nothing named, or ``--all`` with names.
        StateConflict: an unknown flow, or no active fence for the flow's functions.
    """
    if every:
        if functions or flows:
            raise UsageError("--all restores every active fence; leave out --function and --flow")
        return None
    selection = select(conn, functions, flows)
    if flows:
        fenced = {f.function_name for f in active_fences(conn, selection.functions)}
        keep = sorted(set(functions) | (fenced & set(selection.functions)))
        if not keep:
            raise StateConflict(
                f"no active fence for the functions serving {', '.join(selection.requested_flows)}",
                hint="see `pgflow fence status`")
        selection = Selection(keep, selection.requested_flows, [r for r in selection.routes if r.function_name in keep])
    return selection


# ----------------------------------------------------------------------------------------------
# disable
# ----------------------------------------------------------------------------------------------
def disable(conn: psycopg.Connection, selection: Selection, reason: str, *, dry_run: bool = False,
            lock_timeout: float = 5.0, attempts: int = 5) -> DisableResult:
    """Record, disable and deprecate in one transaction (rolled back for ``dry_run``).

    Args:
        conn: autocommit connection.
        selection: from :func:`select`.
        reason: why (``-m``), 1 to 1000 characters, stored with the fence.
        dry_run: report the rows it would change and roll back.
        lock_timeout: seconds to wait for a function row lock (a registering worker holds it
            for milliseconds); timeouts are retried ``attempts`` times.

    Returns:
        :class:`DisableResult` with one :class:`FenceChange` per function and the workers deprecated.

    Raises:
        UsageError: empty or too long reason (exit 2).
        StateConflict: an unknown function, or an active fence the row no longer matches (exit 6);
            nothing was changed.
        LockTimeout: the rows stayed locked through every attempt (exit 4).
    """
    reason = (reason or "").strip()
    if not reason:
        raise UsageError("-m REASON is required: say why the functions are fenced (kept with the fence)")
    if len(reason) > MAX_REASON:
        raise UsageError(f"the reason is {len(reason)} characters; at most {MAX_REASON} are kept")

    def body(tx: psycopg.Connection) -> DisableResult:
        workers = _rows_to(Worker, _fetch(tx, "workers_to_deprecate", {"functions": selection.functions}))
        rows = _fetch(tx, "disable", {"functions": selection.functions, "reason": reason})
        refused = [r for r in rows if r["action"] in ("unknown", "stale_fence")]
        if refused:
            raise _disable_refusal(refused)
        return DisableResult(selection, _rows_to(FenceChange, rows), workers, dry_run,
                             outcome="dry_run" if dry_run else "fenced")

    written: Any = _write(conn, body, dry_run=dry_run, lock_timeout=lock_timeout, attempts=attempts)
    return written  # type: ignore[no-any-return]  # _write returns what body returns


def _write(conn: psycopg.Connection, body: Callable[[psycopg.Connection], Any], *, dry_run: bool,
           lock_timeout: float, attempts: int) -> Any:
    """Run ``body`` in one write transaction, retried on lock timeouts; rolled back for a dry run."""

    def attempt() -> Any:
        with db.transaction(conn, lock_timeout=lock_timeout, statement_timeout=60) as tx:
            result = body(tx)
            if dry_run:
                raise _Rollback(result)
            return result

    try:
        return db.retry_on_lock(attempt, attempts=attempts)
    except _Rollback as rolled_back:
        return rolled_back.result


class _Rollback(Exception):
    """Leaves a dry-run transaction by rolling it back, carrying its result out."""

    def __init__(self, result: Any) -> None:
        super().__init__("dry run")
        self.result = result


def _disable_refusal(rows: list[dict[str, Any]]) -> StateConflict:
    unknown = [r["function_name"] for r in rows if r["action"] == "unknown"]
    stale = [r for r in rows if r["action"] == "stale_fence"]
    detail = [f"{name}: no such worker function" for name in unknown]
    detail += [f"{r['function_name']}: fence #{r['fence_id']} ({r['fenced_by']}, {r['fenced_at']:%Y-%m-%d %H:%M:%S %Z}, "
               f"\"{r['fence_reason']}\") no longer holds: enabled was changed since (now {r['enabled']})" for r in stale]
    hints = []
    if unknown:
        hints.append("worker functions exist once a worker registered: SELECT function_name FROM pgflow.worker_functions; "
                     "or select by --flow SLUG")
    if stale:
        hints.append("close the stale fence with `pgflow fence restore --function "
                     + " --function ".join(r["function_name"] for r in stale)
                     + "` (it reports the conflict and leaves the row as it is), then disable again")
    return StateConflict(f"nothing was fenced: {len(rows)} function(s) cannot be fenced", hint="; ".join(hints),
                         detail=detail)


# ----------------------------------------------------------------------------------------------
# drain
# ----------------------------------------------------------------------------------------------
def drain_progress(conn: psycopg.Connection, functions: Sequence[str], *, window: float = DEFAULT_WINDOW,
                   task_limit: int = TASK_LIST_LIMIT) -> DrainProgress:
    """One read-only look at the functions' live workers, started tasks and queued backlog.

    Args:
        functions: worker function names.
        window: heartbeat window, seconds (> 0).
        task_limit: most started tasks listed one by one.
    """
    params = {"functions": list(functions), "window": float(window), "limit": task_limit}
    with db.transaction(conn, read_only=True, isolation="repeatable read", lock_timeout=5, statement_timeout=30) as tx:
        workers = _rows_to(Worker, _fetch(tx, "live_workers", params))
        steps = _rows_to(StepLoad, _fetch(tx, "started_by_step", params))
        tasks = _rows_to(StartedTask, _fetch(tx, "started_tasks", params))
        backlog = _rows_to(Backlog, _fetch(tx, "backlog", params))
    return DrainProgress(list(functions), float(window), workers, steps, tasks, backlog)


def wait_for_drain(conn: psycopg.Connection, functions: Sequence[str], *, window: float = DEFAULT_WINDOW,
                   timeout: float = DEFAULT_DRAIN_TIMEOUT, interval: float = 1.0,
                   on_progress: Callable[[DrainProgress], None] | None = None,
                   clock: Callable[[], float] = time.monotonic) -> DrainProgress:
    """Wait until no worker of ``functions`` is live and none of their tasks is in flight.

    Args:
        window: heartbeat window, seconds.
        timeout: seconds before giving up.
        interval: seconds between looks.
        on_progress: called with every look (for the live view).

    Returns:
        The last :class:`DrainProgress` (drained; stranded tasks are listed in it).

    Raises:
        DeadlineReached: still draining at ``timeout`` (exit 5); the detail names every live worker and
            every task in flight. The fence stays in place.
        KeyboardInterrupt: propagated (the caller says that the fence stays).
    """
    started = clock()
    while True:
        progress = drain_progress(conn, functions, window=window)
        progress.elapsed = clock() - started
        if on_progress:
            on_progress(progress)
        if progress.drained:
            return progress
        if progress.elapsed >= timeout:
            raise drain_deadline(progress, timeout)
        time.sleep(max(0.0, min(interval, timeout - progress.elapsed)))


def drain_deadline(progress: DrainProgress, timeout: float) -> DeadlineReached:
    """The exit-5 error naming every live worker and every in-flight task (first ``TASK_LIST_LIMIT``)."""
    listed = [t for t in progress.tasks if t.in_flight]
    detail = [w.label() for w in progress.workers] + [t.label() for t in listed]
    if progress.in_flight > len(listed):
        detail.append(f"... and {progress.in_flight - len(listed)} more task(s) in flight")
    return DeadlineReached(
        f"the drain did not finish within {timeout:g} s: {len(progress.workers)} worker(s) still live, "
        f"{progress.in_flight} task(s) in flight; the fence stays in place",
        hint="keep watching with `pgflow fence status --watch`, or undo the fence with `pgflow fence restore "
        + " ".join(f"--function {f}" for f in progress.functions) + "`",
        detail=detail,
    )


# ----------------------------------------------------------------------------------------------
# restore
# ----------------------------------------------------------------------------------------------
def restore(conn: psycopg.Connection, selection: Selection | None, *, dry_run: bool = False,
            lock_timeout: float = 5.0, attempts: int = 5) -> RestoreResult:
    """Write back the recorded values where the rows are unchanged; close every processed fence.

    Args:
        selection: the functions (``None``: every active fence).
        dry_run: report what would happen and roll back.

    Returns:
        :class:`RestoreResult`; :meth:`RestoreResult.conflict_error` is set when rows were left alone
        (they are committed as conflicts: the fence is closed, the row untouched).

    Raises:
        StateConflict: no recorded fence for a named function, or no active fence at all (exit 6);
            nothing was changed.
        LockTimeout: the rows stayed locked through every attempt (exit 4).
    """
    names = selection.functions if selection is not None else None
    shown = selection or Selection([])

    def body(tx: psycopg.Connection) -> RestoreResult:
        rows = _fetch(tx, "restore", {"functions": names})
        missing = [r["function_name"] for r in rows if r["outcome"] == "not_fenced"]
        if missing:
            raise StateConflict(
                f"no recorded fence for {', '.join(missing)}: nothing was restored",
                hint="`pgflow fence status` lists the active fences; a function enabled by hand needs no restore")
        if not rows:
            raise StateConflict("no active fence is recorded: nothing to restore",
                                hint="`pgflow fence status` lists the active fences")
        changes = [FenceChange(**{**{k: v for k, v in r.items() if k != "outcome"}, "action": r["outcome"]})
                   for r in rows]
        result = RestoreResult(shown if names is not None else Selection(sorted(c.function_name for c in changes)),
                               changes, dry_run)
        result.outcome = "dry_run" if dry_run else ("conflict" if result.conflicts else "restored")
        return result

    written: Any = _write(conn, body, dry_run=dry_run, lock_timeout=lock_timeout, attempts=attempts)
    return written  # type: ignore[no-any-return]  # _write returns what body returns


def wait_for_heartbeats(conn: psycopg.Connection, functions: Sequence[str], since: dt.datetime, *,
                        window: float = DEFAULT_WINDOW, timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
                        interval: float = 1.0, on_progress: Callable[[list[Worker], list[str]], None] | None = None,
                        clock: Callable[[], float] = time.monotonic) -> list[Worker]:
    """Wait until each function has a running worker that heartbeat at or after ``since``.

    Returns:
        The new workers (at least one per function).

    Raises:
        DeadlineReached: a function had no new worker at ``timeout`` (exit 5), named in the detail.
    """
    started = clock()
    while True:
        with db.transaction(conn, read_only=True, lock_timeout=5, statement_timeout=30) as tx:
            workers = _rows_to(Worker, [{**r, "deprecated": False} for r in _fetch(
                tx, "new_workers", {"functions": list(functions), "since": since, "window": float(window)})])
        missing = sorted(set(functions) - {w.function_name for w in workers})
        if on_progress:
            on_progress(workers, missing)
        if not missing:
            return workers
        elapsed = clock() - started
        if elapsed >= timeout:
            raise DeadlineReached(
                f"no new worker heartbeat within {timeout:g} s for {len(missing)} restored function(s): "
                + ", ".join(missing),
                hint="the functions are enabled again; check that the new code is deployed and starts (its logs) "
                "and look at its worker rows: SELECT * FROM pgflow.workers WHERE function_name = '...'",
                detail=[f"{name}: no worker registered or heartbeat since the restore" for name in missing],
            )
        time.sleep(max(0.0, min(interval, timeout - elapsed)))


# ----------------------------------------------------------------------------------------------
# status
# ----------------------------------------------------------------------------------------------
def active_fences(conn: psycopg.Connection, functions: Sequence[str] | None = None) -> list[ActiveFence]:
    """Active fences (of ``functions``, or all) with their function rows as they are now."""
    return _rows_to(ActiveFence, _fetch(conn, "active_fences", {"functions": list(functions) if functions else None}))


def status(conn: psycopg.Connection, functions: Sequence[str] | None = None, *,
           window: float = DEFAULT_WINDOW) -> StatusReport:
    """The active fences and the drain progress of their functions (read-only)."""
    fences = active_fences(conn, functions)
    drain = drain_progress(conn, [f.function_name for f in fences], window=window) if fences else None
    return StatusReport(fences, drain)

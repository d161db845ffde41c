"""``pgflow exporter``: the database's state as Prometheus metrics, for alerting (docs/observability.md).

One scrape reads one snapshot: the queries of ``pgflow coverage`` (every route's state, backlog and
oldest message), of ``pgflow status`` (per flow runs and tasks by state, the oldest queued task,
stalled and given-up tasks, workers), of ``pgflow fence status`` (active fences) and the migration
ledger, run through their own functions here (one home for each rule). The snapshot is kept for
``cache_seconds``; scrapes that arrive meanwhile, or while it is being read, get the same one (a
lock lets one scrape refresh it while the others wait), so any number of scrapers costs one query
set per interval.

Nothing read here holds run inputs, outputs or message bodies: counts, ages, slugs, queue and
function names only. The exporter refuses a role that can write pgflow's or PGMQ's data
(:func:`write_privileges`) unless told otherwise: a monitoring credential should not be able to
change what it watches.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pgflow_cli import db, installer, sqlfiles
from pgflow_cli.errors import ConnectionFailed, UsageError
from pgflow_cli.operations import coverage, fence, status
from pgflow_cli.worker.metrics import MetricsServer
from pgflow_cli.worker.observe import sqlstate_class

log = logging.getLogger("pgflow.exporter")

QUERIES = "queries/exporter.sql"

DEFAULT_CACHE_SECONDS = 10.0
"""Seconds a snapshot serves scrapes: below a typical 15 s scrape interval, so one Prometheus sees a
fresh snapshot each time while extra scrapers share it."""

FAILURE_RETRY_SECONDS = 5.0
"""Seconds a failed read answers scrapes (``pgflow_exporter_up 0``) before the next scrape tries again,
so scrapers of a database that is down do not each wait for a connection attempt."""

ROUTE_LABELS = ("flow", "step", "queue")
"""Labels of a route's series: ``step`` is empty for a plain flow's route (the whole flow)."""


@dataclass(frozen=True)
class MigrationLevel:
    """The migration ledger in numbers.

    Attributes:
        level: the highest migration version recorded as applied (0: none).
        pending: migrations this tool ships that the ledger does not record.
        in_progress: versions of phased migrations that committed some phases but not the last.
        in_progress_since: when the oldest of those recorded its last phase (None when none).
    """

    level: int
    pending: int
    in_progress: tuple[int, ...]
    in_progress_since: dt.datetime | None


@dataclass(frozen=True)
class Snapshot:
    """What one refresh read.

    Attributes:
        coverage: every route with its state (:func:`pgflow_cli.operations.coverage.check_coverage`).
        status: every flow (:func:`pgflow_cli.operations.status.collect`).
        fences: the active fences, or None where the database has no fence record.
        drain: what the fenced functions still run (``pgflow fence status``'s drain), None without fences.
        migrations: the ledger's level.
        read_seconds: how long the queries took, seconds.
        taken_at: when the refresh ended (``time.monotonic()``).
    """

    coverage: coverage.CoverageReport
    status: status.StatusReport
    fences: list[fence.ActiveFence] | None
    drain: fence.DrainProgress | None
    migrations: MigrationLevel
    read_seconds: float
    taken_at: float


def write_privileges(conn: psycopg.Connection) -> list[str]:
    """What the connected role could change: ``table pgflow.runs``, ``function pgflow.x(...)``, ...

    Returns:
        Sorted descriptions; empty for a read-only role.
    """
    return [row[0] for row in conn.execute(sqlfiles.statement(QUERIES, "write_privileges")).fetchall()]


def check_role(conn: psycopg.Connection, *, allow_write: bool) -> list[str]:
    """Refuse a role the exporter should not run as.

    Args:
        conn: an autocommit connection as that role.
        allow_write: accept a role that can write (``--allow-write-role``).

    Returns:
        What the role could write (empty for a read-only role; only with ``allow_write``).

    Raises:
        UsageError: the role can write and ``allow_write`` is False (exit 2).
        ConnectionFailed: the role may not read the fence record (exit 3; the hint names the GRANT).
    """
    writable = write_privileges(conn)
    if writable and not allow_write:
        shown = writable[:8] + ([f"... and {len(writable) - 8} more"] if len(writable) > 8 else [])
        raise UsageError(
            "the exporter's role can change pgflow's data; it only reads, so it refuses to run as a role that can write",
            hint="connect as a read-only role (docs/observability.md \"A role for the exporter\"), or pass "
            "--allow-write-role to run anyway",
            detail=[f"can write: {item}" for item in shown])
    missing = db.scalar(conn.execute(sqlfiles.statement(QUERIES, "fence_read_missing")))
    if missing:
        raise ConnectionFailed(
            "the exporter's role may not read the rollout fence record (EXECUTE on pgflow._fence_holds)",
            hint="GRANT EXECUTE ON FUNCTION pgflow._fence_holds(pgflow.fences, pgflow.worker_functions) TO <role>; "
            "docs/observability.md \"A role for the exporter\"")
    return writable


def migration_level(conn: psycopg.Connection) -> MigrationLevel:
    """The ledger's level, pending and in-progress migrations (read-only)."""
    rows = installer.ledger(conn)
    recorded = {row.version for row in rows}
    phased = sorted((row for row in rows if row.state == "in_progress"), key=lambda row: row.version)
    since = min((row.applied_at for row in phased if isinstance(row.applied_at, dt.datetime)), default=None)
    return MigrationLevel(
        level=max((row.version for row in rows if row.state == "applied"), default=0),
        pending=sum(1 for migration in installer.available_migrations() if migration.version not in recorded),
        in_progress=tuple(row.version for row in phased),
        in_progress_since=since,
    )


def read_snapshot(conn: psycopg.Connection, *, heartbeat_window: float, statement_timeout: float | None = 30.0) \
        -> Snapshot:
    """Read one snapshot (read-only; each part in its own read-only transaction).

    Args:
        conn: an autocommit connection.
        heartbeat_window: seconds; a worker is live when its last heartbeat is at most this old.
        statement_timeout: seconds each statement may run (None: no limit).

    Raises:
        psycopg.Error: whatever the server raised (missing privileges, no pgflow schema, ...).
    """
    began = time.monotonic()
    routes = coverage.check_coverage(conn, heartbeat_window=heartbeat_window, statement_timeout=statement_timeout)
    flows = status.collect(conn, heartbeat_window=heartbeat_window, statement_timeout=statement_timeout)
    installed = bool(db.scalar(conn.execute(sqlfiles.statement(fence.QUERIES, "installed"))))
    fences = fence.active_fences(conn) if installed else None
    drain = fence.drain_progress(conn, [f.function_name for f in fences], window=heartbeat_window, task_limit=1) \
        if fences else None
    migrations = migration_level(conn)
    ended = time.monotonic()
    return Snapshot(routes, flows, fences, drain, migrations, ended - began, ended)


def _gauge(name: str, documentation: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=list(labels))


def snapshot_metrics(snapshot: Snapshot, now: dt.datetime | None = None) -> Iterator[Metric]:
    """The Prometheus families of one snapshot (docs/observability.md lists each)."""
    route_state = _gauge("pgflow_route_state", "1 for the route's coverage state (pgflow coverage), 0 for the others",
                         (*ROUTE_LABELS, "state"))
    waiting = _gauge("pgflow_route_work_waiting", "1 when the route has no live worker while messages wait",
                     ROUTE_LABELS)
    backlog = _gauge("pgflow_route_backlog_messages", "Messages in the route's queue, visible or not", ROUTE_LABELS)
    visible = _gauge("pgflow_route_visible_messages", "Messages of the route's queue readable now", ROUTE_LABELS)
    oldest = _gauge("pgflow_route_oldest_message_age_seconds", "Age of the oldest message in the route's queue "
                    "(absent when the queue is empty)", ROUTE_LABELS)
    workers = _gauge("pgflow_route_workers", "Unstopped worker rows serving the route, by liveness (live, draining: "
                     "deprecated but heartbeating, stale: no heartbeat within the window)", (*ROUTE_LABELS, "state"))
    stalled, given_up = (_gauge(name, text, ROUTE_LABELS) for name, text in (
        ("pgflow_route_stalled_tasks", "Started tasks of the route the next pgflow.requeue_stalled_tasks() call "
         "takes back (their worker is gone or late)"),
        ("pgflow_route_given_up_tasks", "Started tasks of the route stalled recovery gave up on: nobody will "
         "finish them")))
    flows = {flow.flow_slug: flow for flow in snapshot.status.flows}
    for route in snapshot.coverage.routes:
        labels = [route.flow_slug, route.step_slug or "", route.queue_name]
        flow = flows.get(route.flow_slug)
        if flow is not None and flow.stalled is not None:  # known where the schema has stalled recovery
            counts = [c for step, c in flow.stalled_by_step.items() if route.step_slug in (None, step)]
            stalled.add_metric(labels, float(sum(c[0] for c in counts)))
            given_up.add_metric(labels, float(sum(c[1] for c in counts)))
        for state in coverage.STATES:
            route_state.add_metric([*labels, state], 1.0 if route.state == state else 0.0)
        waiting.add_metric(labels, 1.0 if route.work_waiting else 0.0)
        if route.backlog is not None:
            backlog.add_metric(labels, float(route.backlog))
        if route.visible_messages is not None:
            visible.add_metric(labels, float(route.visible_messages))
        if route.oldest_message_age_seconds is not None:
            oldest.add_metric(labels, route.oldest_message_age_seconds)
        for state, count in (("live", route.live_workers), ("draining", route.draining_workers),
                             ("stale", route.stale_workers)):
            workers.add_metric([*labels, state], float(count))
    yield from (route_state, waiting, backlog, visible, oldest, workers, stalled, given_up)
    yield from _flow_metrics(snapshot.status)
    yield from _fence_metrics(snapshot.fences, snapshot.drain)
    yield from _migration_metrics(snapshot.migrations, now or dt.datetime.now(dt.timezone.utc))


def _flow_metrics(report: status.StatusReport) -> Iterator[Metric]:
    runs = _gauge("pgflow_flow_runs", "Runs of the flow by state (started: in flight)", ("flow", "state"))
    tasks = _gauge("pgflow_flow_tasks", "Tasks of the flow by state", ("flow", "state"))
    queued_age = _gauge("pgflow_flow_oldest_queued_task_age_seconds", "Seconds the flow's longest-waiting queued task "
                        "has waited since it was (re)queued (absent when nothing is queued)", ("flow",))
    stalled = _gauge("pgflow_flow_stalled_tasks", "Started tasks the next pgflow.requeue_stalled_tasks() call "
                     "takes back (their worker is gone or late)", ("flow",))
    given_up = _gauge("pgflow_flow_given_up_tasks", "Started tasks stalled recovery gave up on: nobody will finish "
                      "them", ("flow",))
    manual = _gauge("pgflow_flow_waiting_manual_tasks", "Tasks of manual steps waiting for their outcome", ("flow",))
    workers = _gauge("pgflow_flow_workers", "Unstopped worker rows serving the flow, by liveness", ("flow", "state"))
    for flow in report.flows:
        for state, count in flow.runs.items():
            runs.add_metric([flow.flow_slug, state], float(count))
        for state, count in flow.tasks.items():
            tasks.add_metric([flow.flow_slug, state], float(count))
        if flow.oldest_queued is not None:
            queued_age.add_metric([flow.flow_slug], flow.oldest_queued.age_seconds)
        if flow.stalled is not None:
            stalled.add_metric([flow.flow_slug], float(flow.stalled))
        if flow.permanently_stalled is not None:
            given_up.add_metric([flow.flow_slug], float(flow.permanently_stalled))
        if flow.waiting is not None:
            manual.add_metric([flow.flow_slug], float(flow.waiting))
        for state, count in (flow.workers or {}).items():
            workers.add_metric([flow.flow_slug, state], float(count))
    yield from (runs, tasks, queued_age, stalled, given_up, manual, workers)


def _fence_metrics(fences: list[fence.ActiveFence] | None, drain: fence.DrainProgress | None) -> Iterator[Metric]:
    if fences is None:
        return
    count = _gauge("pgflow_fences_active", "Active rollout fences (pgflow fence status)")
    count.add_metric([], float(len(fences)))
    age, disabled, live, in_flight, stranded = (_gauge(name, text, ("function",)) for name, text in (
        ("pgflow_fence_age_seconds", "Seconds since the function's active fence was set"),
        ("pgflow_fence_function_enabled", "1 when the fenced function is enabled again (changed since the fence), "
         "0 while it stays disabled"),
        ("pgflow_fence_live_workers", "Workers of the fenced function still heartbeating within the window "
         "(draining: deprecated, finishing their tasks)"),
        ("pgflow_fence_tasks_in_flight", "Started tasks of the fenced function's workers whose worker still "
         "heartbeats (the drain waits for them)"),
        ("pgflow_fence_tasks_stranded", "Started tasks of the fenced function's workers whose worker stopped "
         "heartbeating (stalled recovery requeues them)")))
    for active in fences:
        name = active.function_name
        age.add_metric([name], active.age_seconds)
        disabled.add_metric([name], 1.0 if active.enabled else 0.0)
        if drain is not None:
            live.add_metric([name], float(sum(1 for w in drain.workers if w.function_name == name)))
            in_flight.add_metric([name], float(sum(s.in_flight for s in drain.steps if s.function_name == name)))
            stranded.add_metric([name], float(sum(s.stranded for s in drain.steps if s.function_name == name)))
    yield from (count, age, disabled, live, in_flight, stranded)


def _migration_metrics(level: MigrationLevel, now: dt.datetime) -> Iterator[Metric]:
    current = _gauge("pgflow_migration_level", "Highest migration version the ledger records as applied")
    current.add_metric([], float(level.level))
    pending = _gauge("pgflow_migrations_pending", "Migrations this exporter's pgflow-cli ships that the database "
                     "does not record")
    pending.add_metric([], float(level.pending))
    running = _gauge("pgflow_migration_in_progress", "1 while a phased migration has committed some phases but not "
                     "the last (an upgrade in progress)")
    running.add_metric([], 1.0 if level.in_progress else 0.0)
    age = _gauge("pgflow_migration_in_progress_age_seconds", "Seconds since the migration in progress last "
                 "committed a phase (absent when none is in progress)")
    if level.in_progress_since is not None:
        age.add_metric([], max(0.0, (now - level.in_progress_since).total_seconds()))
    yield from (current, pending, running, age)


class SnapshotCollector(Collector):
    """The exporter's collector: reads a snapshot on scrape, at most once per ``cache_seconds``.

    Args:
        connect: opens an autocommit connection (called again after a connection error).
        cache_seconds: how long one snapshot serves scrapes.
        heartbeat_window: seconds, the worker liveness window.

    Attributes:
        refreshes: snapshots read so far; ``errors`` refreshes that failed.
    """

    def __init__(self, connect: Callable[[], psycopg.Connection], *, cache_seconds: float,
                 heartbeat_window: float) -> None:
        self._connect = connect
        self._conn: psycopg.Connection | None = None
        self.cache_seconds = cache_seconds
        self.heartbeat_window = heartbeat_window
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._failed_at: float | None = None
        self.refreshes = 0
        self.errors: dict[str, int] = {}
        self.last_error: str | None = None

    def snapshot(self) -> Snapshot | None:
        """The current snapshot, read now if the cached one is older than ``cache_seconds``; None when
        the last read failed (its error is :attr:`last_error`)."""
        arrived = time.monotonic()
        with self._lock:
            latest = self._failed_at if self._failed_at is not None else \
                (self._snapshot.taken_at if self._snapshot is not None else None)
            # a read that ended after this scrape arrived (it waited for the lock meanwhile) is as
            # fresh as one it would read itself: concurrent scrapes share one read even without a cache
            keep = self.cache_seconds if self._failed_at is None else min(self.cache_seconds, FAILURE_RETRY_SECONDS)
            if latest is not None and (latest >= arrived or time.monotonic() - latest < keep):
                return self._snapshot if self._failed_at is None else None
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                self._snapshot = read_snapshot(self._conn, heartbeat_window=self.heartbeat_window)
                self._failed_at = None
                self.last_error = None
            except (psycopg.Error, ConnectionFailed) as exc:
                self._failed_at = time.monotonic()
                kind = sqlstate_class(exc) if isinstance(exc, psycopg.Error) else "08"
                self.errors[kind] = self.errors.get(kind, 0) + 1
                self.last_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                log.warning("exporter: could not read the snapshot (%s)", self.last_error)
                if isinstance(exc, psycopg.OperationalError) and self._conn is not None:
                    self._conn.close()
                return None
            finally:
                self.refreshes += 1
            return self._snapshot

    def health(self) -> tuple[bool, str]:
        """Healthy while the latest snapshot was read (a failed read: 503 with its error)."""
        snapshot = self.snapshot()
        return (True, "ok") if snapshot is not None else (False, f"cannot read the database: {self.last_error}")

    def collect(self) -> Iterator[Metric]:
        began = time.monotonic()
        snapshot = self.snapshot()
        up = _gauge("pgflow_exporter_up", "1 when the latest snapshot was read, 0 when reading it failed")
        up.add_metric([], 1.0 if snapshot is not None else 0.0)
        yield up
        refreshes = CounterMetricFamily("pgflow_exporter_refreshes", "Snapshots read (query sets run)")
        refreshes.add_metric([], float(self.refreshes))
        yield refreshes
        errors = CounterMetricFamily("pgflow_exporter_errors", "Snapshot reads that failed, by SQLSTATE class",
                                     labels=["sqlstate_class"])
        for kind, count in sorted(self.errors.items()):
            errors.add_metric([kind], float(count))
        yield errors
        if snapshot is None:
            return
        read = _gauge("pgflow_exporter_read_seconds", "Seconds the latest snapshot's queries took")
        read.add_metric([], snapshot.read_seconds)
        age = _gauge("pgflow_exporter_snapshot_age_seconds", "Seconds since the served snapshot was read")
        age.add_metric([], max(0.0, time.monotonic() - snapshot.taken_at))
        yield from (read, age)
        yield from snapshot_metrics(snapshot)
        scrape = _gauge("pgflow_exporter_scrape_seconds", "Seconds this scrape took (waiting for a shared refresh "
                        "included)")
        scrape.add_metric([], time.monotonic() - began)
        yield scrape

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()


class Exporter:
    """The exporter's registry and HTTP server.

    Args:
        connect: opens an autocommit connection as the exporter's role.
        host / port: where to listen (port 0: any free port, see :attr:`address`).
        cache_seconds / heartbeat_window: as :class:`SnapshotCollector` takes them.

    Raises:
        UsageError: the address cannot be bound (exit 2).
    """

    def __init__(self, connect: Callable[[], psycopg.Connection], *, host: str, port: int,
                 cache_seconds: float = DEFAULT_CACHE_SECONDS,
                 heartbeat_window: float = coverage.DEFAULT_HEARTBEAT_WINDOW) -> None:
        self.collector = SnapshotCollector(connect, cache_seconds=cache_seconds, heartbeat_window=heartbeat_window)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        try:
            self.server = MetricsServer(self.registry, self.collector.health, host=host, port=port)
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                             hint="pick another --listen address or port (port 0: any free port)") from None

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` the server listens on."""
        return self.server.address

    def close(self) -> None:
        """Stop serving and close the connection."""
        self.server.close()
        self.collector.close()


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9465`` for IPv6; ``:9465`` for every IPv4 interface) as ``(host, port)``.

    Raises:
        UsageError: not of that form, or a port outside 0-65535 (exit 2).
    """
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise UsageError(f"--listen {text!r} is not HOST:PORT", hint="e.g. --listen 127.0.0.1:9465, --listen :9465 "
                         "(every interface), --listen [::1]:9465; port 0 picks a free port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port_text)

"""The reference worker: compile, register, heartbeat, poll, claim, run handlers, report.

Lifecycle (states: created -> starting -> running -> draining -> stopped):

1. **starting**: check the protocol version, compile the flow (``ensure_flow_compiled``),
   register the worker row. Any refusal (protocol mismatch, fenced function, shape
   mismatch) raises before anything was registered or polled.
2. **running**: one poll thread long-polls the worker's queue for as many messages as the
   worker has capacity for (at most ``batch_size``; see "Capacity" below), claims them, and
   hands each claimed task to a handler slot (``max_concurrent`` of them, see "Handlers"). Every
   ``heartbeat_interval`` seconds it records a heartbeat; a deprecated worker stops polling.
3. **draining**: no more polling; claimed tasks and in-flight handlers finish and their reports
   are sent (up to ``drain_timeout`` seconds) while heartbeats go on, so a draining worker is
   told apart from a dead one (``pgflow fence`` waits for the first and reports the second).
   Triggered by :meth:`Worker.stop`, SIGTERM/SIGINT in :meth:`Worker.run`, deprecation, or a
   fatal claim outcome.
4. **stopped**: the worker row is marked stopped. Tasks whose handlers were still running
   stay ``started`` and are recovered by stalled-task recovery.

Capacity. A claim starts the task's attempt and hides its message for the step's effective
timeout (+ 2 s); a claimed task that waits in the worker for a free handler spends that
window. The worker therefore claims, beyond its free handler slots, only the tasks it expects
to start within half of the shortest effective timeout of the steps it serves: with ``d`` the
moving average of how long a handler slot stays taken, ``max_concurrent * floor(budget / d)``
more, at most ``batch_size`` more. It claims nothing beyond its free slots before it has seen a
handler finish, or while a handler runs for much longer than ``d`` (it could be stuck). A
claimed task that still waited longer than its effective timeout is not run (its message may
already be visible to others); it stays ``started`` for stalled-task recovery. ``prefetch=False``
reads only as many messages as there are free slots.

Reports. Where the database has ``pgflow.complete_tasks`` / ``pgflow.fail_tasks`` (protocol 2,
found once at startup) and ``batch_reports`` is on, a handler thread queues its report and
takes the next task; one reporter thread sends everything queued in one call (completions and
failures in finish order, each consecutive run of one kind in one call), a lone report at once
through ``complete_task`` / ``fail_task``. A batch call that raises applied nothing; its tasks
are then reported one by one, so one refused report never loses the others. Elsewhere each
handler thread reports its own task with one call. Draining sends every queued report before
the worker marks itself stopped; a killed worker loses its unsent reports, and their tasks,
still ``started``, come back through stalled-task recovery like any task of a dead worker.

Handlers. A ``def`` handler runs in one of ``max_concurrent`` daemon threads; an ``async def``
handler runs on the worker's own event loop (one daemon thread), where as many run at once as
slots are free; both kinds share the same slots and the same capacity rule. Each handler gets a
:class:`~pgflow_cli.worker.context.TaskContext` with its attempt, the step's ``max_attempts``, its
deadline (claim + effective timeout), the run input (read once per run on first use) and a stop
signal. The signal is set for every in-flight task when the worker drains, and for one task when
the heartbeat's check (one query for all in-flight tasks, once per ``heartbeat_interval``) finds
its run or step ended, or the task taken over. A handler's ``RetryLater`` / ``FailNow``
(:mod:`pgflow_cli.worker.control`) travel with its failure report.

Stopping. The first SIGTERM/SIGINT in :meth:`Worker.run` drains; a second one (or
:meth:`Worker.stop_now`, or the drain timeout) stops now: ``async def`` handlers are cancelled
(their ``finally`` blocks run), ``def`` handlers are left running in their daemon threads, what
is already queued for reporting is sent (briefly), the worker row is marked stopped, and the
tasks still running stay ``started`` for stalled-task recovery (requeued once their step
timeout + 30 s have passed since the claim). ``run()`` then returns 130.

Metrics. With ``options.metrics_port`` the worker serves Prometheus metrics and ``/healthz`` from
its own registry (:mod:`pgflow_cli.worker.metrics`, started before registration, closed once the
worker has stopped); every event goes to an observer that does nothing without a port
(:mod:`pgflow_cli.worker.observe`). Completions and failures count once their report call returned.

Logs carry flow, step, run, task index, queue and message ids only, never inputs, outputs or
message bodies. A failed attempt is logged at WARNING when the database will retry it (attempt
k/n, in how many seconds, the exception's type and message) and at ERROR when it ends the task;
``log_tracebacks`` adds the traceback. Database errors while polling are retried with backoff.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import itertools
import logging
import math
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from pgflow_cli import db
from pgflow_cli.db import first_line
from pgflow_cli.worker.context import STOP_DRAINING, RunInputs, TaskContext
from pgflow_cli.worker.errors import MetricsUnavailable
from pgflow_cli.worker.execution import DaemonThreads, EventLoopThread, Slots
from pgflow_cli.worker.failures import GENERIC_FAILURE, RetryPolicy, TaskFailure
from pgflow_cli.worker.flow import FlowDefinition, StepDefinition
from pgflow_cli.worker.observe import Observer
from pgflow_cli.worker.options import WorkerOptions
from pgflow_cli.worker.protocol import (
    LATEST,
    SQLSTATE_NOT_REGISTERED,
    SQLSTATE_PROTOCOL,
    ClaimedTask,
    StepSettings,
)
from pgflow_cli.worker.reports import PendingReport, ReportQueue
from pgflow_cli.worker.text import storable_text, unstorable

log = logging.getLogger("pgflow.worker")

STALE_ROW_TYPE_RETRIES = 2
"""How many times a report that failed with 42804 (the task table changed shape while the call
waited for a migration's lock; see :meth:`Worker._report`) is sent again before it counts as refused."""

DEFAULT_SETTINGS = StepSettings(timeout=60, max_attempts=3, base_delay=5)
"""Settings assumed for a step the database did not describe (``create_flow``'s defaults)."""
DEFAULT_TIMEOUT = DEFAULT_SETTINGS.timeout

SHORT_READ_VT = 5
"""Seconds a read message stays hidden before its claim when the claim sets the visibility anyway."""


def read_visibility(poll_vt: int | None, protocol_version: int, settings: dict[str, StepSettings]) -> int:
    """Seconds a read hides its messages until the claim (``pgmq.read``'s visibility timeout).

    Args:
        poll_vt: the worker option; a number of seconds wins.
        protocol_version: the worker's protocol; from 2 on, a claim keeps a visibility already within
            1 s of its own target (effective timeout + 2 s) instead of writing the message again.
        settings: the effective settings of the steps the worker serves, by step slug.

    Returns:
        ``poll_vt`` when set; else, on protocol 2 and later when every served step has the same
        effective timeout, that timeout + 2 (the claim's target, so it need not touch the message);
        else :data:`SHORT_READ_VT`.
    """
    if poll_vt is not None:
        return poll_vt
    timeouts = {s.timeout for s in settings.values()}
    if protocol_version >= 2 and len(timeouts) == 1:
        return timeouts.pop() + 2
    return SHORT_READ_VT


SLOT_AVERAGE_WEIGHT = 0.2
"""Weight of the newest handler-slot duration in the moving average the capacity estimate uses."""

CANCEL_GRACE = 2.0
"""Seconds cancelled ``async def`` handlers get to run their ``finally`` blocks at a forced stop."""

FORCED_STOP_WAIT = 2.0
"""Seconds a forced stop still gives the queued reports and the worker row's ``stopped`` mark."""

INTERRUPTED = 130
"""What :meth:`Worker.run` returns after a forced stop by a second signal (docs/exit-codes.md)."""

Outcome = tuple[bool, Any]
"""``(True, output)`` or ``(False, TaskFailure)``."""


class _ClaimBatch:
    """The tasks of one claim, and their attempt numbers once a task asks: read for the whole batch
    in one query (:meth:`ProtocolV1.claimed_attempts`), at most once."""

    def __init__(self, worker: Worker, tasks: list[ClaimedTask]) -> None:
        self._worker = worker
        self._message_ids = [task.message_id for task in tasks]
        self._lock = threading.Lock()
        self._attempts: dict[int, int] | None = None

    def attempt(self, message_id: int) -> int:
        """The attempt of the task behind ``message_id`` (1 if another claim has taken it meanwhile).

        Raises:
            psycopg.Error: the read failed (asked again next time).
        """
        with self._lock:
            if self._attempts is None:
                self._attempts = self._worker._read_attempts(self._message_ids)
            return self._attempts.get(message_id, 1)


@dataclass
class WorkerStats:
    """Counters for tests, benchmarks and the final log line.

    ``report_batches`` counts batch calls that succeeded and ``batch_reported`` the tasks they
    reported; ``batch_fallbacks`` counts batch calls that raised (their tasks were then
    reported one by one); ``expired`` counts claimed tasks not run because they waited longer
    than their effective timeout; ``cancelled`` counts ``async def`` handlers cancelled by a
    forced stop; ``stop_signals`` counts tasks whose stop signal the heartbeat's check set
    (their run or step ended, or the task was taken over); ``refused`` counts reports the
    database refused because the task's run was cancelled (or failed) before them: nothing of
    those results was recorded (the task counts the refusal, ``step_tasks.refused_reports``).
    """

    polls: int = 0
    messages_read: int = 0
    claimed: int = 0
    completed: int = 0
    failed: int = 0
    duplicates: int = 0
    archived: int = 0
    report_errors: int = 0
    poll_errors: int = 0
    report_batches: int = 0
    batch_reported: int = 0
    batch_fallbacks: int = 0
    expired: int = 0
    cancelled: int = 0
    stop_signals: int = 0
    refused: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **deltas: int) -> None:
        with self.lock:
            for key, value in deltas.items():
                setattr(self, key, getattr(self, key) + value)

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {k: v for k, v in self.__dict__.items() if k != "lock"}


class Worker:
    """One worker process serving one concrete flow (or one private step of it).

    Args:
        flow: the flow definition with handlers.
        conninfo: libpq connection string of the pgflow database.
        function_name: the worker function this worker belongs to (``worker_functions`` key;
            the rollout fence acts on it).
        step_slug: serve only this step's private queue (protocol 2+ step-queued flows).
        options: how it runs (:class:`~pgflow_cli.worker.options.WorkerOptions`; the defaults
            when omitted).
        protocol: a protocol object (default: the latest this package speaks).
        worker_id: UUID of the worker row (random by default).

    Attributes:
        reports_batched: after :meth:`start`, whether reports go through the batch entry points.
        retry_control: after :meth:`start`, whether the database honours ``RetryLater`` / ``FailNow``.
        metrics_address: after :meth:`start` with ``options.metrics_port`` set, the ``(host, port)``
            its metrics server listens on (the port chosen when ``metrics_port`` was 0); else ``None``.
        paused: a fatal claim outcome paused the worker's function (the worker then stops).

    Raises:
        DefinitionError: the flow and ``step_slug`` do not fit together (see
            ``Protocol.queue_for``), before any database access.
    """

    def __init__(
        self,
        flow: FlowDefinition,
        conninfo: str,
        *,
        function_name: str,
        step_slug: str | None = None,
        options: WorkerOptions | None = None,
        protocol: Any = None,
        worker_id: str | None = None,
    ) -> None:
        self.flow = flow
        self.conninfo = conninfo
        self.function_name = function_name
        self.options = options or WorkerOptions()
        self.protocol = protocol or LATEST()
        self.step_slug = step_slug
        self.worker_id = worker_id or str(uuid.uuid4())
        self.queue_name = self.protocol.queue_for(flow, step_slug)
        self.stats = WorkerStats()
        self.state = "created"
        self.stop_reason: str | None = None
        self.fatal: str | None = None
        self.reports_batched = False
        self.retry_control = False
        self.metrics_address: tuple[str, int] | None = None
        self.paused = False
        self._observer = Observer()
        self.left_running = 0
        """Tasks still running when the worker stopped (left to stalled-task recovery)."""
        self._steps: dict[str, StepDefinition] = {step.slug: step for step in flow.steps}
        self._stop = threading.Event()
        self._force = threading.Event()
        self._stopped = threading.Event()
        self._signals = 0
        self._started_at = time.monotonic()
        # capacity bookkeeping, all under _cv: claimed tasks waiting for a handler slot, handlers
        # running (since when) and their contexts, moving average of a slot's duration
        self._cv = threading.Condition()
        self._waiting = 0
        self._running: dict[int, float] = {}
        self._active: dict[int, tuple[ClaimedTask, TaskContext]] = {}
        self._by_task: dict[tuple[str, str, int], int] = {}
        """The token of the running attempt of each task (run, step, index)."""
        self._taken_over: set[int] = set()
        """Tokens of running attempts another claim of their task has replaced: never reported."""
        self._slot_seconds: float | None = None
        self._tokens = itertools.count()
        self._settings: dict[str, StepSettings] = {}
        self._start_budget = DEFAULT_TIMEOUT / 2
        self._read_vt = self.options.poll_vt or SHORT_READ_VT
        most = max(self.options.batch_size, self.options.max_concurrent)
        self._reports = ReportQueue(2 * most)
        self._inputs = RunInputs(self._read_run_input, self.options.run_inputs_cached)
        self._reporter: threading.Thread | None = None
        self._pool: ConnectionPool | None = None
        self._slots = Slots(self.options.max_concurrent)
        self._threads: DaemonThreads | None = None
        self._loop: EventLoopThread | None = None
        self._side: DaemonThreads | None = None
        self._thread: threading.Thread | None = None
        self._disowned = False

    # lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        """Check protocol, compile, register, then start polling in a background thread.

        Order: protocol version, fence (a disabled function is refused before its flow is
        compiled, so a restarted old worker never recreates a dropped flow), compilation,
        registration (which checks the fence again, atomically).

        Raises:
            WorkerStartupError: protocol mismatch, fenced function or shape mismatch;
                nothing was registered or polled.
            ConnectionFailed: the database could not be reached or refused the connection (exit 3 in
                the CLI); the worker is then stopped too.
            psycopg.Error: any other database error during startup; the worker is then stopped too.
        """
        if self.state != "created":
            raise RuntimeError(f"worker already {self.state}")
        self.state = "starting"
        try:
            self._serve_metrics()
            with db.connect(self._target(), application_name=self.options.application_name,
                            connect_timeout=self.options.connect_timeout) as startup:
                self.protocol.check_version(startup)
                self.protocol.check_enabled(startup, self.function_name)
                result = self.protocol.compile_flow(startup, self.flow, self.step_slug)
                self.protocol.register(
                    startup, worker_id=self.worker_id, function_name=self.function_name, queue_name=self.queue_name,
                    flow_slug=self.flow.slug, step_slug=self.step_slug, worker_version=self.options.worker_version,
                )
                self.reports_batched = self.options.batch_reports and self.protocol.has_batch_reports(startup)
                self.retry_control = self.protocol.has_retry_control(startup)
                self._settings = self.protocol.step_settings(startup, self.flow.slug, self.step_slug)
        except BaseException:
            # Nothing was registered; the worker is finished, not stuck in 'starting'.
            self._observer.close()
            self.state = "stopped"
            self.stop_reason = self.stop_reason or "startup failed"
            self._stopped.set()
            raise
        self._start_budget = min((s.timeout for s in self._settings.values()), default=DEFAULT_TIMEOUT) / 2
        self._read_vt = read_visibility(self.options.poll_vt, self.protocol.version, self._settings)
        log.info(
            "worker %s started: flow=%s step=%s queue=%s function=%s compile=%s protocol=%s reports=%s",
            self.worker_id, self.flow.slug, self.step_slug or "-", self.queue_name, self.function_name,
            result.get("status"), self.protocol.version, "batched" if self.reports_batched else "one per call",
            extra={"event": "worker_started", "worker_id": self.worker_id, "flow": self.flow.slug,
                   "step": self.step_slug, "queue": self.queue_name},
        )
        served = [self._steps[slug] for slug in (self._settings or self._steps) if slug in self._steps]
        has_async = any(step.handler is not None and step.is_async for step in served)
        self._pool = ConnectionPool(
            db.connection_string(self._target(), application_name=self.options.application_name,
                                 connect_timeout=self.options.connect_timeout),
            min_size=1,
            max_size=self.options.max_concurrent + 2,
            # no server-side prepared statements: a transaction-mode pooler may stand between
            kwargs={"autocommit": True, "prepare_threshold": db.POOLER_SAFE_PREPARE},
            open=True,
            name=f"pgflow-worker-{self.worker_id[:8]}",
        )
        self._threads = DaemonThreads(self.options.max_concurrent, "pgflow-task")
        if has_async:
            self._loop = EventLoopThread("pgflow-async")
            # blocking work of async handlers (their reports, a run input's first read) runs here
            self._side = DaemonThreads(max(2, min(self.options.max_concurrent, 8)), "pgflow-side")
        self._started_at = time.monotonic()
        self._observer.start(self)
        self.state = "running"
        if self.reports_batched:
            self._reporter = threading.Thread(target=self._report_loop, name="pgflow-report", daemon=True)
            self._reporter.start()
        self._thread = threading.Thread(target=self._main_loop, name="pgflow-poll", daemon=True)
        self._thread.start()

    def _serve_metrics(self) -> None:
        """Start the metrics server when ``options.metrics_port`` is set (imports ``prometheus_client``
        only then).

        Raises:
            MetricsUnavailable: the ``metrics`` extra is not installed, or the address cannot be bound.
        """
        port = self.options.metrics_port
        if port is None:
            return
        try:
            from pgflow_cli.worker.metrics import PrometheusObserver
        except ImportError as exc:
            raise MetricsUnavailable(
                f"metrics need the prometheus-client package, which is not installed ({exc})",
                hint="pip install 'pgflow-cli[metrics]', or start the worker without a metrics port") from None
        host = self.options.metrics_host
        try:
            observer = PrometheusObserver(
                flow_slug=self.flow.slug, step_slug=self.step_slug, queue_name=self.queue_name, host=host, port=port,
                health_window=max(10.0, 3 * self.options.heartbeat_interval) + self.options.max_poll_seconds)
        except OSError as exc:
            raise MetricsUnavailable(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}",
                                     hint="pick another --metrics-port (0: any free port) or --metrics-host") from None
        self._observer = observer
        self.metrics_address = observer.address
        log.info("worker %s: metrics on %s/metrics, health on %s/healthz", self.worker_id, observer.server.url,
                 observer.server.url, extra={"event": "metrics_serving", "worker_id": self.worker_id,
                                             "metrics_host": observer.address[0], "metrics_port": observer.address[1]})

    def _target(self) -> db.Target:
        return db.Target(self.conninfo, f"worker {self.function_name}")

    def stop(self, reason: str = "stop requested") -> None:
        """Ask the worker to stop polling and drain (returns at once; see :meth:`join`)."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self._stop.set()

    def stop_now(self, reason: str = "stop now requested") -> None:
        """Stop without waiting for running handlers (returns at once; see :meth:`join`): ``async def``
        handlers are cancelled, ``def`` handlers are left running, their tasks stay ``started`` for
        stalled-task recovery. Queued reports are still sent (for a moment) and the worker row is
        marked stopped."""
        if self.stop_reason is not None and not self._force.is_set():
            self.stop_reason = f"{self.stop_reason}, then {reason}"
        self.stop(reason)
        self._force.set()
        with self._cv:
            self._cv.notify_all()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the worker has fully stopped. Returns False on timeout."""
        return self._stopped.wait(timeout)

    def tasks_in_flight(self) -> int:
        """Claimed tasks whose handler has not finished (waiting for a handler slot or running)."""
        return self._in_flight()

    def run(self) -> int:
        """Start, then block until stopped. The first SIGTERM or SIGINT drains (running handlers
        finish, up to ``drain_timeout``); a second one stops now (:meth:`stop_now`).

        Returns:
            0 after a clean stop, 1 after a fatal claim outcome, 130 after a second signal.
        """
        def on_signal(signum: int, _frame: Any) -> None:
            name = signal.Signals(signum).name
            self._signals += 1
            if self._signals == 1:
                log.info("received %s: draining %d in-flight task(s) (at most %.0fs); send it again to stop now and "
                         "leave them to stalled-task recovery", name, self.tasks_in_flight(), self.options.drain_timeout,
                         extra={"event": "drain", "worker_id": self.worker_id, "reason": f"signal {name}"})
                self.stop(f"signal {name}")
            elif not self._force.is_set():
                log.warning("received %s again: stopping now; %d task(s) still in flight stay started and stalled-task "
                            "recovery requeues each one once its step timeout + 30 s have passed since its claim",
                            name, self.tasks_in_flight(),
                            extra={"event": "stop_now", "worker_id": self.worker_id, "reason": f"second {name}",
                                   "left_running": self.tasks_in_flight()})
                self.stop_now(f"second {name}")

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            while not self.join(0.5):
                pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self._force.is_set() and self._signals > 1:
            return INTERRUPTED
        return 1 if self.fatal else 0

    # loop -------------------------------------------------------------------------
    def _main_loop(self) -> None:
        assert self._pool is not None
        next_heartbeat = 0.0
        backoff = 0.5
        try:
            while not self._stop.is_set():
                try:
                    now = time.monotonic()
                    if now >= next_heartbeat:
                        with self._pool.connection() as conn:
                            deprecated = self.protocol.heartbeat(conn, self.worker_id, **self._route())
                            self._observer.heartbeat()
                            if deprecated:
                                log.info("worker %s deprecated: stops polling and drains", self.worker_id)
                                self.stop("deprecated")
                                break
                            self._check_in_flight(conn)
                        next_heartbeat = now + self.options.heartbeat_interval
                    capacity = self._capacity()
                    if capacity == 0:
                        self._wait_for_capacity(min(self.options.heartbeat_interval, 1.0))
                        self._observer.round()
                        continue
                    self._poll_once(min(capacity, self.options.batch_size))
                    backoff = 0.5
                except psycopg.Error as exc:
                    self._observer.database_error("poll", exc)
                    if getattr(exc, "sqlstate", None) == SQLSTATE_PROTOCOL:
                        # The database was upgraded under this worker: retrying can never succeed,
                        # and every retry would hide a batch of messages from the new workers.
                        self.fatal = f"the database no longer speaks protocol {self.protocol.version}: {first_line(exc)}"
                        log.error("worker %s: FATAL %s. Stopping; deploy a worker of the database's protocol.",
                                  self.worker_id, self.fatal)
                        self.stop("protocol mismatch")
                        break
                    if getattr(exc, "sqlstate", None) == SQLSTATE_NOT_REGISTERED:
                        # The worker row is gone or its id now belongs to another route: this
                        # process is stale. Stop without touching the row (it is not ours).
                        self.fatal = f"this worker id no longer belongs to this process: {first_line(exc)}"
                        self._disowned = True
                        log.error("worker %s: FATAL %s. Stopping without marking the row stopped.",
                                  self.worker_id, self.fatal)
                        self.stop("worker id disowned")
                        break
                    self.stats.add(poll_errors=1)
                    log.warning("worker %s: database error while polling (%s); retrying in %.1fs",
                                self.worker_id, type(exc).__name__, backoff)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 10.0)
        finally:
            self._drain()

    def _poll_once(self, qty: int) -> None:
        assert self._pool is not None
        with self._pool.connection() as conn:
            message_ids = self.protocol.read(
                conn, queue_name=self.queue_name, vt=self._read_vt, qty=qty,
                # a long poll never outlasts the heartbeat interval by much: the fence and coverage
                # tell a live worker from a dead one by its heartbeat age
                max_poll_seconds=min(self.options.max_poll_seconds, max(1, math.ceil(self.options.heartbeat_interval))),
                poll_interval_ms=self.options.poll_interval_ms,
            )
            self.stats.add(polls=1, messages_read=len(message_ids))
            self._observer.polled(len(message_ids))
            if not message_ids:
                return
            if self._stop.is_set():
                # Stopping: take no new work, but do not hide it either until the read's
                # visibility timeout ends; another worker can claim it right away.
                self._release_quietly(conn, message_ids)
                return
            # the claim's moment, taken before the call: a task's deadline is never later than the
            # database's (its visibility ends at the claim + the effective timeout + 2 s)
            claimed_at = time.monotonic()
            try:
                outcome = self.protocol.claim(
                    conn, flow_slug=self.flow.slug, step_slug=self.step_slug, queue_name=self.queue_name,
                    message_ids=message_ids, worker_id=self.worker_id,
                )
            except psycopg.Error:
                # the claim rolled back (nothing was claimed): hand the batch back now rather than
                # after the read's visibility, which may be the steps' whole timeout (read_visibility);
                # on a lost connection the hand-back fails too and the read's visibility stands
                if not conn.closed:
                    self._release_quietly(conn, message_ids)
                raise
        self.stats.add(claimed=len(outcome.claimed), duplicates=len(outcome.duplicates),
                       archived=len(outcome.archived_terminal) + len(outcome.archived_foreign))
        for message_id in outcome.archived_foreign:
            log.warning("worker %s: archived foreign message %s in queue %s (not pgflow work)",
                        self.worker_id, message_id, self.queue_name)
        for task in outcome.claimed:
            self._observer.claimed(task.step_slug)
        if outcome.fatal_reason:
            self.fatal = outcome.fatal_reason
            self.paused = True
            log.error(
                "worker %s: FATAL unsupported work in queue %s (messages %s): %s. Nothing was claimed; the batch "
                "was made visible again and function %s is paused. Stopping.",
                self.worker_id, self.queue_name, ",".join(map(str, outcome.fatal_messages)), outcome.fatal_reason,
                self.function_name,
            )
            self.stop("fatal claim outcome")
            return
        batch = _ClaimBatch(self, outcome.claimed)
        for task in outcome.claimed:
            self._submit(task, claimed_at, batch)

    def _route(self) -> dict[str, Any]:
        """The route this worker registered (heartbeats are checked against it)."""
        return {"function_name": self.function_name, "queue_name": self.queue_name,
                "flow_slug": self.flow.slug, "step_slug": self.step_slug}

    def _release_quietly(self, conn: psycopg.Connection, message_ids: list[int]) -> None:
        """Make read-but-unclaimed messages visible again; a failure only means they wait out the read's visibility."""
        try:
            self.protocol.release(conn, self.queue_name, message_ids)
        except psycopg.Error as exc:
            log.warning("worker %s: could not hand back messages %s (%s); they are visible again after %ss",
                        self.worker_id, ",".join(map(str, message_ids)), type(exc).__name__, self._read_vt)

    # capacity -----------------------------------------------------------------------
    def _in_flight(self) -> int:
        """Claimed tasks not finished yet (waiting for a handler thread or running)."""
        with self._cv:
            return self._waiting + len(self._running)

    def _capacity(self) -> int:
        """How many more tasks to claim now: free handler slots plus the prefetch allowance."""
        with self._cv:
            return max(0, self.options.max_concurrent + self._prefetch_allowance() - self._waiting - len(self._running))

    def _prefetch_allowance(self) -> int:
        """Tasks that may wait for a slot: those expected to start within the start budget (caller holds _cv)."""
        average = self._slot_seconds
        if not self.options.prefetch or average is None:
            return 0
        now = time.monotonic()
        longest = max((now - since for since in self._running.values()), default=0.0)
        if longest > 2 * average + 0.05:
            return 0  # a handler runs far longer than usual: when a slot frees is unknown
        rounds = int(self._start_budget // max(average, longest, 1e-4))
        return min(self.options.batch_size, self.options.max_concurrent * rounds)

    def _wait_for_capacity(self, timeout: float) -> None:
        """Wait until a handler starts or finishes (or ``timeout`` seconds, or a stop)."""
        with self._cv:
            self._cv.wait(timeout)

    def _submit(self, task: ClaimedTask, claimed_at: float, batch: _ClaimBatch | None = None) -> None:
        """Hand a claimed task to a handler slot: the event loop for an ``async def`` handler, a
        thread otherwise (``claimed_at``: the claim's moment on the monotonic clock)."""
        assert self._threads is not None
        with self._cv:
            self._waiting += 1
        step = self._steps.get(task.step_slug)
        if self._loop is not None and step is not None and step.handler is not None and step.is_async:
            future = self._loop.submit(self._execute_async(task, claimed_at, batch))
        else:
            future = self._threads.submit(self._execute, task, claimed_at, batch)
        future.add_done_callback(lambda done: self._log_escaped(task, done.exception()) if not done.cancelled() else None)

    def _log_escaped(self, task: ClaimedTask, exc: BaseException | None) -> None:
        """Last line of defence: an executor would swallow an exception that escaped the task's run."""
        if exc is not None and not isinstance(exc, asyncio.CancelledError):  # pragma: no cover
            log.error("worker %s: BUG: task %s/%s/%s escaped the report path (%s); it stays started for "
                      "stalled-task recovery", self.worker_id, task.run_id, task.step_slug, task.task_index,
                      type(exc).__name__)

    # task execution -----------------------------------------------------------------
    def _begin(self, task: ClaimedTask, claimed_at: float,
               batch: _ClaimBatch | None) -> tuple[int, TaskContext | None]:
        """Take a slot for ``task``; returns its token and context, or no context when the task waited
        longer than its effective timeout (it is then not run: its message may already be visible to
        others, and it stays ``started`` for stalled-task recovery)."""
        token = next(self._tokens)
        started = time.monotonic()
        with self._cv:
            self._waiting -= 1
            self._running[token] = started
            self._cv.notify_all()
        settings = self._settings.get(task.step_slug, DEFAULT_SETTINGS)
        timeout = settings.timeout
        if started - claimed_at > timeout:
            self.stats.add(expired=1)
            log.warning("worker %s: task %s/%s/%s waited %.0fs for a handler, longer than its %ss timeout; "
                        "not run, it stays started for stalled-task recovery", self.worker_id, task.run_id,
                        task.step_slug, task.task_index, started - claimed_at, timeout)
            return token, None
        context = self._context(task, claimed_at, settings, batch)
        key = (task.run_id, task.step_slug, task.task_index)
        with self._cv:
            # a running attempt of the same task in this worker is an older claim of it (its claim
            # timed out and stalled-task recovery gave the task back): its result must not count
            other = self._by_task.get(key)
            if other is not None and other in self._active:
                self._taken_over.add(other)
                self._active[other][1].stop.set("a newer claim of the task runs in this worker")
            self._by_task[key] = token
            self._active[token] = (task, context)
        if self._stop.is_set():  # claimed before the drain began: the handler learns it at once
            context.stop.set(STOP_DRAINING)
        return token, context

    def _end(self, token: int) -> None:
        """Give the slot back and update the moving average of how long a slot stays taken."""
        with self._cv:
            seconds = time.monotonic() - self._running.pop(token)
            ended = self._active.pop(token, None)
            if ended is not None:
                key = (ended[0].run_id, ended[0].step_slug, ended[0].task_index)
                if self._by_task.get(key) == token:
                    del self._by_task[key]
            average = self._slot_seconds
            self._slot_seconds = seconds if average is None else (average + SLOT_AVERAGE_WEIGHT * (seconds - average))
            self._cv.notify_all()

    def _context(self, task: ClaimedTask, claimed_at: float, settings: StepSettings,
                 batch: _ClaimBatch | None) -> TaskContext:
        run_id = task.run_id
        step = self._steps.get(task.step_slug)
        known: dict[str, Any] = {}
        if step is not None and step.step_type == "single" and not step.dependencies:
            known["flow_input"] = task.flow_input  # a root single step's claim carries the run input
            self._inputs.remember(run_id, task.flow_input)
        side = self._side
        return TaskContext(
            flow_slug=task.flow_slug, run_id=run_id, step_slug=task.step_slug, task_index=task.task_index,
            message_id=task.message_id, queue_name=task.queue_name, worker_id=self.worker_id,
            attempt=task.attempt,
            load_attempt=(lambda: batch.attempt(task.message_id)) if batch is not None else None,
            max_attempts=settings.max_attempts,
            deadline_clock=claimed_at + settings.timeout,
            load_flow_input=lambda: self._inputs.get(run_id),
            load_flow_input_async=(lambda: asyncio.wrap_future(side.submit(self._inputs.get, run_id)))
            if side is not None else None,
            **known,
        )

    def _read_attempts(self, message_ids: list[int]) -> dict[int, int]:
        assert self._pool is not None
        with self._pool.connection() as conn:
            return self.protocol.claimed_attempts(conn, flow_slug=self.flow.slug, queue_name=self.queue_name,
                                                  message_ids=message_ids, worker_id=self.worker_id)

    def _read_run_input(self, run_id: str) -> Any:
        assert self._pool is not None
        with self._pool.connection() as conn:
            return self.protocol.run_input(conn, run_id)

    def _execute(self, task: ClaimedTask, claimed_at: float, batch: _ClaimBatch | None = None) -> None:
        """Run one claimed task's ``def`` handler in this thread and report (or queue its report).
        Never raises: every attempt ends reported, or is logged and left ``started`` for stalled-task
        recovery."""
        shared = self._loop is not None  # without async handlers the thread pool alone bounds the slots
        if shared:
            self._slots.acquire()
        try:
            token, context = self._begin(task, claimed_at, batch)
            try:
                if context is not None:
                    self._finish(task, context, token, self._call(task, context))
            except BaseException as exc:  # nothing may vanish silently in a handler thread
                self._lost(task, exc)
            finally:
                self._end(token)
        finally:
            if shared:
                self._slots.release()

    async def _execute_async(self, task: ClaimedTask, claimed_at: float, batch: _ClaimBatch | None) -> None:
        """:meth:`_execute` for an ``async def`` handler, on the worker's event loop; the report is
        sent from a thread, so a slow database never blocks the other handlers on the loop."""
        await self._slots.acquire_async()
        try:
            await self._run_async(task, claimed_at, batch)
        finally:
            self._slots.release()

    async def _run_async(self, task: ClaimedTask, claimed_at: float, batch: _ClaimBatch | None) -> None:
        token, context = self._begin(task, claimed_at, batch)
        reporting = False
        try:
            if context is not None:
                outcome = await self._call_async(task, context)
                assert self._side is not None
                reporting = True
                if not self._queued_at_once(task, token, outcome):
                    await asyncio.wrap_future(self._side.submit(self._finish, task, context, token, outcome))
        except asyncio.CancelledError:
            if not reporting:
                self.stats.add(cancelled=1)
                log.warning("task %s/%s/%s: its async handler was cancelled by the forced stop; the task stays "
                            "started for stalled-task recovery", task.run_id, task.step_slug, task.task_index,
                            extra=self._fields(task, context, event="task_cancelled"))
            raise
        except BaseException as exc:
            self._lost(task, exc)
        finally:
            self._end(token)

    def _lost(self, task: ClaimedTask, exc: BaseException) -> None:
        self.stats.add(report_errors=1)
        log.error("worker %s: could not finish task %s/%s/%s (%s); it stays started for stalled-task recovery",
                  self.worker_id, task.run_id, task.step_slug, task.task_index, type(exc).__name__)

    def _handler_input(self, task: ClaimedTask, step: StepDefinition) -> Any:
        return task.flow_input if (step.step_type == "single" and not step.dependencies) else task.input

    def _call(self, task: ClaimedTask, context: TaskContext) -> Outcome:
        """Run a ``def`` handler; returns ``(True, output)`` or ``(False, TaskFailure)``."""
        step = self._steps.get(task.step_slug)
        if step is None or step.handler is None:
            return self._failed(task, context, TaskFailure.plain(
                f"worker has no handler for step {task.step_slug!r}", "MissingHandler"))
        began = time.perf_counter()
        try:
            output = step.call(self._handler_input(task, step), context)
        except BaseException as exc:  # the handler's failure is the task's failure, whatever it raised
            self._observer.handler_finished(task.step_slug, time.perf_counter() - began)
            return self._failed(task, context, self._failure(exc), exc)
        self._observer.handler_finished(task.step_slug, time.perf_counter() - began)
        if inspect.isawaitable(output):
            if inspect.iscoroutine(output):
                output.close()  # never awaited, on purpose: no "was never awaited" warning
            return self._failed(task, context, TaskFailure.plain(
                f"TypeError: the handler of step {task.step_slug!r} is a plain function that returned a "
                f"{type(output).__name__}; declare the handler itself `async def` (the worker awaits it on its "
                "event loop)", "TypeError", fail_now=True))
        return self._stored(task, context, output)

    async def _call_async(self, task: ClaimedTask, context: TaskContext) -> Outcome:
        """Run an ``async def`` handler; returns ``(True, output)`` or ``(False, TaskFailure)``."""
        step = self._steps[task.step_slug]
        assert step.handler is not None
        began = time.perf_counter()
        try:
            output = await step.call(self._handler_input(task, step), context)
        except asyncio.CancelledError:
            if self._force.is_set():
                raise  # the forced stop: the task is left to stalled-task recovery
            self._observer.handler_finished(task.step_slug, time.perf_counter() - began)
            return self._failed(task, context, TaskFailure.plain(
                "CancelledError: the handler was cancelled", "CancelledError"))
        except BaseException as exc:
            self._observer.handler_finished(task.step_slug, time.perf_counter() - began)
            return self._failed(task, context, self._failure(exc), exc)
        self._observer.handler_finished(task.step_slug, time.perf_counter() - began)
        return self._stored(task, context, output)

    def _failure(self, exc: BaseException) -> TaskFailure:
        return TaskFailure.from_exception(exc, store_traceback=self.options.store_tracebacks)

    def _stored(self, task: ClaimedTask, context: TaskContext, output: Any) -> Outcome:
        problem = unstorable(output)
        if problem:
            return self._failed(task, context, TaskFailure.plain(
                f"handler output cannot be stored: {problem}", "UnstorableOutput"))
        return True, output

    def _failed(self, task: ClaimedTask, context: TaskContext, failure: TaskFailure,
                exc: BaseException | None = None) -> Outcome:
        """Log a failed attempt: WARNING when the database will retry it, ERROR when it ends the task."""
        step = self._steps.get(task.step_slug)
        settings = self._settings.get(task.step_slug, DEFAULT_SETTINGS)
        policy = RetryPolicy(max_attempts=settings.max_attempts, base_delay=settings.base_delay,
                             when_exhausted=step.when_exhausted if step is not None else "fail")
        try:
            attempt = context.attempt
        except Exception as exc:  # the failure is reported all the same; only its log line lacks the number
            log.warning("task %s/%s/%s: could not read its attempt number (%s)", task.run_id, task.step_slug,
                        task.task_index, type(exc).__name__)
            attempt = 0
        retry_in = policy.next_attempt_in(max(attempt, 1), failure, retry_control=self.retry_control)
        fields = self._fields(task, context, event="task_failed", retry_in_seconds=retry_in,
                              error_type=failure.error_type, error=failure.summary,
                              when_exhausted=policy.when_exhausted)
        asked = failure.asked()
        note = f" (asked {asked}: this database does not support that yet, an ordinary failure)" \
            if asked and not self.retry_control else ""
        traceback = exc if self.options.log_tracebacks and exc is not None else None
        where = (task.flow_slug, task.step_slug, task.run_id, task.task_index, task.message_id)
        if retry_in is not None:
            log.warning("task failed (attempt %d/%d), retried in %ss: flow=%s step=%s run=%s task=%s msg=%s: %s%s",
                        attempt, policy.max_attempts, f"{retry_in:g}", *where, failure.summary, note,
                        exc_info=traceback, extra=fields)
        else:
            ending = (f"on its last attempt ({attempt}/{policy.max_attempts})"
                      if attempt >= policy.max_attempts else
                      f"for good at attempt {attempt}/{policy.max_attempts} (FailNow)")
            log.error("task failed %s; the step's when_exhausted=%s applies: flow=%s step=%s run=%s task=%s msg=%s: "
                      "%s%s", ending, policy.when_exhausted, *where, failure.summary, note,
                      exc_info=traceback, extra=fields)
        return False, dataclasses.replace(failure, final=retry_in is None)

    def _fields(self, task: ClaimedTask, context: TaskContext | None, **more: Any) -> dict[str, Any]:
        """A task's log fields (``extra``; :mod:`pgflow_cli.worker.logs`)."""
        fields = {"worker_id": self.worker_id, "flow": task.flow_slug, "step": task.step_slug, "run_id": task.run_id,
                  "task_index": task.task_index, "message_id": task.message_id, "queue": task.queue_name}
        if context is not None:
            attempt = context._attempt  # only when known: a log line never reads it from the database
            fields.update(max_attempts=context.max_attempts, **({"attempt": attempt} if attempt else {}))
        fields.update(more)
        return fields

    def _finish(self, task: ClaimedTask, context: TaskContext, token: int, outcome: Outcome) -> None:
        """Report the attempt now, or queue it for the reporter thread; not at all when another claim
        of the task has replaced it (the database would let this late report end that attempt)."""
        ok, payload = outcome
        if self._replaced(token):
            log.warning("task %s/%s/%s: not reported, %s", task.run_id, task.step_slug, task.task_index,
                        context.stop.reason, extra=self._fields(task, context, event="task_not_reported",
                                                                reason=context.stop.reason))
            return
        if not self.reports_batched:
            self._report(task, ok=ok, payload=payload)
        elif not self._reports.put(PendingReport(task, ok, payload)):
            log.error("worker %s: task %s/%s/%s finished after the worker stopped reporting; it stays started "
                      "for stalled-task recovery", self.worker_id, task.run_id, task.step_slug, task.task_index)

    def _replaced(self, token: int) -> bool:
        if not self._taken_over:  # rare: only a newer claim of a running task fills it
            return False
        with self._cv:
            if token in self._taken_over:
                self._taken_over.discard(token)
                return True
            return False

    def _queued_at_once(self, task: ClaimedTask, token: int, outcome: Outcome) -> bool:
        """On the event loop: queue a batched report if the queue has room (no thread handoff, no
        wait); False when :meth:`_finish` must run in a thread (one call per report, a full queue,
        a replaced attempt, or a closed queue, which it logs)."""
        if not self.reports_batched or (self._taken_over and token in self._taken_over):
            return False
        ok, payload = outcome
        return self._reports.offer(PendingReport(task, ok, payload)) is True

    def _check_in_flight(self, conn: psycopg.Connection) -> None:
        """Set the stop signal of every running task whose run or step has ended, or which is no longer
        this attempt's; one query for all of them (at each heartbeat)."""
        with self._cv:
            running = [(token, task, context) for token, (task, context) in self._active.items()
                       if not context.stop.is_set()]
        if not running:
            return
        ended = self.protocol.ended_tasks(conn, self.worker_id,
                                          [(task, context._attempt) for _token, task, context in running])
        for position, (reason, taken_over) in ended.items():
            token, task, context = running[position]
            if taken_over:
                with self._cv:
                    self._taken_over.add(token)
            context.stop.set(reason)
            self.stats.add(stop_signals=1)
            log.info("task %s/%s/%s: %s while its handler runs; its stop signal is set", task.run_id,
                     task.step_slug, task.task_index, reason,
                     extra=self._fields(task, context, event="task_stop_signal", reason=reason))

    def _report(self, task: ClaimedTask, *, ok: bool, payload: Any) -> None:
        """Send complete/fail; retry transient errors; never leave a refused report unreported.

        A result the database refuses (a data error), or one the client cannot even send (an
        encoding error, anything else raised while sending), turns into a failure of the task
        with that reason, so the attempt always ends. Lost connections are retried, and so is
        42804 (a migration added a ``step_tasks`` column while the call waited for its lock; the
        call was rolled back) up to :data:`STALE_ROW_TYPE_RETRIES` times. When even the generic
        failure cannot be recorded, the task is logged at ERROR and left ``started`` for
        stalled-task recovery.
        """
        assert self._pool is not None
        reshaped = 0
        for attempt in range(1, 6):
            try:
                with self._pool.connection() as conn:
                    refused = (self.protocol.complete(conn, task, payload) if ok
                               else self.protocol.fail(conn, task, payload))
                if refused:
                    self._log_refused([task])
                else:
                    self.stats.add(completed=1) if ok else self.stats.add(failed=1)
                    self._observer.report_batch(ok, 1)
                    self._observer.reported(task.step_slug, ok, payload)
                return
            except psycopg.OperationalError as exc:
                self.stats.add(report_errors=1)
                self._observer.database_error("report", exc)
                log.warning("could not report task %s/%s/%s (attempt %d): %s", task.run_id, task.step_slug,
                            task.task_index, attempt, type(exc).__name__)
                time.sleep(min(0.2 * 2 ** attempt, 5))
            except psycopg.errors.DatatypeMismatch as exc:
                if reshaped == STALE_ROW_TYPE_RETRIES:
                    if not self._refused(task, ok, payload, exc):
                        break
                    ok, payload = False, self._instead(ok, payload, exc)
                    continue
                # 42804 "wrong record type supplied in RETURN NEXT": a migration added a column to
                # step_tasks while this call waited for its lock, and the row the function returns
                # no longer has the shape this statement expected when it started. The call was
                # rolled back (nothing recorded): the same report again is safe and succeeds.
                reshaped += 1
                self.stats.add(report_errors=1)
                self._observer.database_error("report", exc)
                log.warning("task %s/%s/%s: the task table changed during the report (%s); sending it again",
                            task.run_id, task.step_slug, task.task_index, first_line(exc))
            except Exception as exc:  # refused by the server (DataError, ...) or unsendable by the client
                if not self._refused(task, ok, payload, exc):
                    break
                ok, payload = False, self._instead(ok, payload, exc)
        log.error("giving up reporting task %s/%s/%s; it stays started and stalled-task recovery will requeue it",
                  task.run_id, task.step_slug, task.task_index)

    @staticmethod
    def _reason(ok: bool, exc: BaseException) -> str:
        what = "output" if ok else "error message"
        return storable_text(f"the database refused the task's {what}: {first_line(exc)}"
                             if isinstance(exc, psycopg.Error)
                             else f"the worker could not send the task's {what}: {type(exc).__name__}")

    def _refused(self, task: ClaimedTask, ok: bool, payload: Any, exc: BaseException) -> bool:
        """Count and log a report the database refused; False when nothing is left to try (the
        generic failure itself was refused)."""
        self.stats.add(report_errors=1)
        if isinstance(exc, psycopg.Error):
            self._observer.database_error("report", exc)
        log.warning("task %s/%s/%s: %s", task.run_id, task.step_slug, task.task_index, self._reason(ok, exc),
                    extra={"event": "report_refused", "worker_id": self.worker_id, "flow": task.flow_slug,
                           "step": task.step_slug, "run_id": task.run_id, "task_index": task.task_index})
        return ok or payload.message != GENERIC_FAILURE

    def _instead(self, ok: bool, payload: Any, exc: BaseException) -> TaskFailure:
        """What to report instead: the refusal as the task's error (the handler's directive kept), or
        the generic failure."""
        if ok:
            return TaskFailure.plain(self._reason(ok, exc), "RefusedOutput")
        failure: TaskFailure = payload
        return failure.with_message(GENERIC_FAILURE)

    def _log_refused(self, tasks: list[ClaimedTask], refused: int | None = None) -> None:
        """Count and log results the database refused because their run was cancelled (or failed)
        before they came: a distinct outcome, not an error (nothing to retry, nothing paused)."""
        count = len(tasks) if refused is None else refused
        self.stats.add(refused=count)
        if refused is None:
            task = tasks[0]
            log.info("task %s/%s/%s: result not recorded: its run was cancelled (or failed) first",
                     task.run_id, task.step_slug, task.task_index,
                     extra={"event": "report_refused_run_ended", "worker_id": self.worker_id, "flow": task.flow_slug,
                            "step": task.step_slug, "run_id": task.run_id, "task_index": task.task_index})
        else:
            log.info("worker %s: %d of a batch of %d results not recorded: their run was cancelled (or failed) "
                     "first", self.worker_id, count, len(tasks),
                     extra={"event": "report_refused_run_ended", "worker_id": self.worker_id})

    # batched reports --------------------------------------------------------------------
    def _report_loop(self) -> None:
        """The reporter thread: send queued reports until the queue is closed and empty."""
        most = max(self.options.batch_size, self.options.max_concurrent)
        while True:
            batch = self._reports.take(most)
            if batch is None:
                return
            try:
                self._flush(batch)
            except BaseException as exc:  # pragma: no cover - _flush reports or logs every task itself
                log.error("worker %s: BUG: %d report(s) escaped the report path (%s); their tasks stay started for "
                          "stalled-task recovery", self.worker_id, len(batch), type(exc).__name__)
            finally:
                self._reports.done()

    def _flush(self, batch: list[PendingReport]) -> None:
        """Send ``batch`` in finish order: each consecutive run of completions (or failures) in one call."""
        for ok, run in itertools.groupby(batch, key=lambda report: report.ok):
            reports = list(run)
            if len(reports) == 1:
                self._report(reports[0].task, ok=ok, payload=reports[0].payload)
                continue
            try:
                refused = self._send_batch(ok, reports)
            except Exception as exc:
                # Nothing of the batch was applied: report each task alone, so the one the
                # database refuses becomes that task's failure and the others still complete.
                self.stats.add(batch_fallbacks=1)
                log.warning("worker %s: a batch of %d %s was not recorded (%s); reporting each task alone",
                            self.worker_id, len(reports), "completions" if ok else "failures",
                            first_line(exc) if isinstance(exc, psycopg.Error) else type(exc).__name__)
                for report in reports:
                    self._report(report.task, ok=report.ok, payload=report.payload)
                continue
            self.stats.add(report_batches=1, batch_reported=len(reports))
            recorded = len(reports) - refused
            self.stats.add(completed=recorded) if ok else self.stats.add(failed=recorded)
            self._observer.report_batch(ok, len(reports))
            for report in reports:
                self._observer.reported(report.task.step_slug, ok, report.payload)

    def _send_batch(self, ok: bool, reports: list[PendingReport]) -> int:
        """One ``complete_tasks`` or ``fail_tasks`` call; lost connections are retried (the calls are
        idempotent: a task already ended is a late report that changes nothing).

        Returns:
            How many of the reports were refused (their run was cancelled or failed first; logged).

        Raises:
            Exception: whatever the last attempt raised.
        """
        assert self._pool is not None
        pairs = [(report.task, report.payload) for report in reports]
        for attempt in range(1, 4):
            try:
                with self._pool.connection() as conn:
                    refused = (self.protocol.complete_many(conn, pairs) if ok
                               else self.protocol.fail_many(conn, pairs))
                if refused:
                    self._log_refused([report.task for report in reports], refused)
                return refused
            except psycopg.OperationalError as exc:
                self.stats.add(report_errors=1)
                self._observer.database_error("report", exc)
                if attempt == 3:
                    raise
                log.warning("worker %s: could not send a batch of %d reports (attempt %d): %s", self.worker_id,
                            len(reports), attempt, type(exc).__name__)
                time.sleep(min(0.2 * 2 ** attempt, 5))
        raise AssertionError("unreachable: the last attempt returns or raises")

    # shutdown -------------------------------------------------------------------------
    def _drain_heartbeat(self) -> None:
        """Heartbeat while handlers finish: a draining worker is still running tasks, and the rollout
        fence (``pgflow fence``) tells a live drain from a dead worker by its heartbeat."""
        try:
            if self._pool:
                with self._pool.connection(timeout=5) as conn:
                    self.protocol.heartbeat(conn, self.worker_id, **self._route())
                self._observer.heartbeat()
        except Exception as exc:  # best effort: the handlers' reports matter more
            if isinstance(exc, psycopg.Error):
                self._observer.database_error("heartbeat", exc)
            log.warning("worker %s: heartbeat while draining failed: %s", self.worker_id, type(exc).__name__)

    def _drain(self) -> None:
        """Stop polling, let running handlers finish (up to ``drain_timeout``, or until :meth:`stop_now`),
        send their reports, mark the worker stopped, and log one summary line."""
        self.state = "draining"
        with self._cv:
            draining = [context for _task, context in self._active.values()]
        for context in draining:
            context.stop.set(STOP_DRAINING)
        deadline = time.monotonic() + self.options.drain_timeout
        next_heartbeat = time.monotonic() + self.options.heartbeat_interval
        while (self._in_flight() or not self._reports.idle()) and time.monotonic() < deadline \
                and not self._force.is_set():
            if time.monotonic() >= next_heartbeat:
                self._drain_heartbeat()
                next_heartbeat = time.monotonic() + self.options.heartbeat_interval
            self._force.wait(0.05)
        forced = self._force.is_set()
        if self._in_flight() and self._loop is not None:
            # async handlers are cancelled at their next await; their finally blocks run
            self._loop.cancel_all(CANCEL_GRACE)
        self.left_running = self._in_flight()
        if self.left_running:
            why = "at the forced stop" if forced else f"after {self.options.drain_timeout:.0f}s"
            log.warning("worker %s: %d task(s) still running %s stay started; stalled-task recovery requeues each "
                        "one once its step timeout + 30 s have passed since its claim", self.worker_id,
                        self.left_running, why,
                        extra={"event": "left_running", "worker_id": self.worker_id,
                               "left_running": self.left_running})
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        self._reports.close()
        wait = FORCED_STOP_WAIT if forced else max(5.0, deadline - time.monotonic())
        if self._reporter is not None:
            # sends what is still queued (reports of handlers that finished at the deadline)
            self._reporter.join(wait)
        try:
            if self._pool and not self._disowned:
                with self._pool.connection(timeout=FORCED_STOP_WAIT if forced else 10) as conn:
                    self.protocol.stopped(conn, self.worker_id)
        except Exception as exc:  # stopping must not raise
            log.warning("worker %s: could not mark itself stopped: %s", self.worker_id, type(exc).__name__)
        finally:
            if self._pool:
                self._pool.close(timeout=FORCED_STOP_WAIT if forced else 5.0)
            if self._side is not None:
                self._side.shutdown(wait=False)
            if self._loop is not None:
                self._loop.close()
            self.state = "stopped"
            self._observer.close()
            log.info("%s", self.summary(), extra={"event": "worker_stopped", "worker_id": self.worker_id,
                                                  "reason": self.stop_reason, "left_running": self.left_running})
            self._stopped.set()

    def summary(self) -> str:
        """One line on what the worker did: why it stopped, for how long it ran, tasks by outcome."""
        counts = self.stats.snapshot()
        seconds = time.monotonic() - self._started_at
        ran = f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.1f}min"
        extras = [f"{counts[key]} {label}" for key, label in (
            ("expired", "not run (waited past their timeout)"), ("cancelled", "cancelled"),
            ("stop_signals", "told their run or step ended"),
            ("refused", "results refused (their run was cancelled or failed first)"), ("report_errors", "report errors"),
            ("poll_errors", "poll errors")) if counts[key]]
        return (f"worker {self.worker_id} stopped ({self.stop_reason or '-'}) after {ran}: {counts['claimed']} claimed, "
                f"{counts['completed']} completed, {counts['failed']} failed, {self.left_running} left to stalled-task "
                f"recovery" + (f"; {', '.join(extras)}" if extras else ""))

"""The reference worker: compile, register, heartbeat, poll, claim, run handlers, report.

Lifecycle (states: created -> starting -> running -> draining -> stopped):

1. **starting**: check the protocol version, compile the flow (``ensure_flow_compiled``),
   register the worker row. Any refusal (protocol mismatch, fenced function, shape
   mismatch) raises before anything was registered or polled.
2. **running**: one poll thread long-polls the worker's queue for as many messages as the
   worker has capacity for (at most ``batch_size``; see "Capacity" below), claims them, and
   hands each claimed task to a thread pool of ``max_concurrent`` handlers. Every
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

Reports. Where the database has ``pgflow.complete_tasks`` / ``pgflow.fail_tasks`` (schema 0010,
found once at startup) and ``batch_reports`` is on, a handler thread queues its report and
takes the next task; one reporter thread sends everything queued in one call (completions and
failures in finish order, each consecutive run of one kind in one call), a lone report at once
through ``complete_task`` / ``fail_task``. A batch call that raises applied nothing; its tasks
are then reported one by one, so one refused report never loses the others. Elsewhere each
handler thread reports its own task with one call. Draining sends every queued report before
the worker marks itself stopped; a killed worker loses its unsent reports, and their tasks,
still ``started``, come back through stalled-task recovery like any task of a dead worker.

Logs carry flow, step, run, task index, queue and message ids only, never inputs,
outputs or message bodies. Database errors while polling are retried with backoff.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from pgflow_cli import db
from pgflow_cli.db import first_line
from pgflow_cli.worker.flow import FlowDefinition, TaskContext
from pgflow_cli.worker.protocol import (
    LATEST,
    SQLSTATE_NOT_REGISTERED,
    SQLSTATE_PROTOCOL,
    ClaimedTask,
)
from pgflow_cli.worker.reports import PendingReport, ReportQueue

log = logging.getLogger("pgflow.worker")

MAX_ERROR_MESSAGE = 2000
"""Characters of a handler's error kept in ``step_tasks.error_message``."""

STALE_ROW_TYPE_RETRIES = 2
"""How many times a report that failed with 42804 (the task table changed shape while the call
waited for a migration's lock; see :meth:`Worker._report`) is sent again before it counts as refused."""
GENERIC_FAILURE = "the handler failed and its error message could not be stored"

DEFAULT_TIMEOUT = 60
"""Effective timeout (seconds) assumed for a step the database did not describe (pgflow's default)."""

SLOT_AVERAGE_WEIGHT = 0.2
"""Weight of the newest handler-slot duration in the moving average the capacity estimate uses."""


def storable_text(text: str) -> str:
    """``text`` made storable in a PostgreSQL ``text`` column of a UTF-8 database.

    NUL becomes ``\\x00`` and every code point UTF-8 cannot encode (lone surrogates, e.g. from
    ``os.fsdecode`` of undecodable bytes) becomes its ``\\udXXX`` escape, so the message stays
    readable instead of failing the report.
    """
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def error_text(exc: BaseException) -> str:
    """The text stored for a failed handler: ``Type: message``, storable, at most 2000 characters.

    Never raises: an exception whose ``__str__`` raises is described by its type and by what
    ``__str__`` raised.
    """
    try:
        name = type(exc).__name__
    except Exception:  # pragma: no cover - a type without a name
        name = "Exception"
    try:
        message = str(exc)
    except Exception as broken:
        try:
            message = f"<its message could not be read: str() raised {type(broken).__name__}>"
        except Exception:  # pragma: no cover
            message = "<its message could not be read>"
    text = f"{name}: {message}" if message else name
    return storable_text(text)[:MAX_ERROR_MESSAGE]


_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
"""A JSON ``\\u0000`` escape (an even run of backslashes before it: not the literal text)."""


def unstorable(output: Any) -> str | None:
    """Why PostgreSQL's jsonb could not hold ``output`` (``None`` when it can).

    Rejects what Python's json accepts but jsonb does not: NaN and Infinity, the NUL character
    (U+0000) in any string, code points UTF-8 cannot encode (lone surrogates), and anything json
    cannot encode at all (including nesting too deep to serialise). The literal text
    ``\\u0000`` (a backslash followed by ``u0000``) is ordinary text and is stored.

    Never raises: whatever serialising raises is described as the reason.
    """
    try:
        text = json.dumps(output, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        return str(exc)
    except RecursionError:
        return "it is nested too deeply to serialise as JSON"
    except Exception as exc:
        return f"serialising it as JSON raised {type(exc).__name__}"
    if "\x00" in text or _NUL_ESCAPE.search(text):
        return "it contains a NUL character (U+0000), which PostgreSQL cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "it contains a code point UTF-8 cannot encode (a lone surrogate), which PostgreSQL cannot store"
    return None


@dataclass
class WorkerStats:
    """Counters for tests, benchmarks and the final log line.

    ``report_batches`` counts batch calls that succeeded and ``batch_reported`` the tasks they
    reported; ``batch_fallbacks`` counts batch calls that raised (their tasks were then
    reported one by one); ``expired`` counts claimed tasks not run because they waited longer
    than their effective timeout.
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
        protocol: a protocol object (default: the latest this package speaks).
        step_slug: serve only this step's private queue (protocol 2+ step-queued flows).
        max_concurrent: handler threads (tasks in flight at once).
        batch_size: most messages read per poll, and most tasks claimed beyond the free
            handler slots (see "Capacity" in the module docstring).
        poll_vt: seconds a read message stays invisible before the claim extends it.
        max_poll_seconds: long-poll duration of one read, seconds.
        poll_interval_ms: pause between empty reads inside one long poll, milliseconds.
        heartbeat_interval: seconds between heartbeats.
        drain_timeout: seconds to wait for in-flight handlers when stopping.
        worker_id: UUID of the worker row (random by default).
        application_name: ``application_name`` of its connections.
        connect_timeout: seconds libpq waits for the server on every connection the worker opens.
        worker_version: free text reported at registration (``workers.worker_version``, shown
            by ``pgflow coverage``); ignored by databases that do not record it.
        batch_reports: send reports through ``complete_tasks`` / ``fail_tasks`` when the database
            has them (found at startup; see :attr:`reports_batched`); False: one call per task.
        prefetch: claim beyond the free handler slots when the tasks are expected to start well
            within their visibility window; False: read only as many messages as slots are free.

    Attributes:
        reports_batched: after :meth:`start`, whether reports go through the batch entry points.
    """

    def __init__(
        self,
        flow: FlowDefinition,
        conninfo: str,
        *,
        function_name: str,
        protocol: Any = None,
        step_slug: str | None = None,
        max_concurrent: int = 10,
        batch_size: int = 10,
        poll_vt: int = 5,
        max_poll_seconds: int = 2,
        poll_interval_ms: int = 100,
        heartbeat_interval: float = 5.0,
        drain_timeout: float = 60.0,
        worker_id: str | None = None,
        application_name: str = "pgflow-worker",
        connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
        worker_version: str | None = None,
        batch_reports: bool = True,
        prefetch: bool = True,
    ) -> None:
        if max_concurrent < 1 or batch_size < 1:
            raise ValueError("max_concurrent and batch_size must be at least 1")
        self.flow = flow
        self.conninfo = conninfo
        self.function_name = function_name
        self.protocol = protocol or LATEST()
        self.step_slug = step_slug
        self.max_concurrent = max_concurrent
        self.batch_size = batch_size
        self.poll_vt = poll_vt
        self.max_poll_seconds = max_poll_seconds
        self.poll_interval_ms = poll_interval_ms
        self.heartbeat_interval = heartbeat_interval
        self.drain_timeout = drain_timeout
        self.worker_id = worker_id or str(uuid.uuid4())
        self.application_name = application_name
        self.connect_timeout = connect_timeout
        self.worker_version = worker_version
        self.queue_name = self.protocol.queue_for(flow, step_slug)
        self.stats = WorkerStats()
        self.state = "created"
        self.stop_reason: str | None = None
        self.fatal: str | None = None
        self.batch_reports = batch_reports
        self.prefetch = prefetch
        self.reports_batched = False
        self._stop = threading.Event()
        self._stopped = threading.Event()
        # capacity bookkeeping, all under _cv: claimed tasks waiting for a handler thread,
        # handlers running (since when), moving average of a slot's duration
        self._cv = threading.Condition()
        self._waiting = 0
        self._running: dict[int, float] = {}
        self._slot_seconds: float | None = None
        self._tokens = itertools.count()
        self._timeouts: dict[str, int] = {}
        self._start_budget = DEFAULT_TIMEOUT / 2
        self._reports = ReportQueue(2 * max(batch_size, max_concurrent))
        self._reporter: threading.Thread | None = None
        self._pool: ConnectionPool | None = None
        self._executor: ThreadPoolExecutor | None = None
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
            with db.connect(self._target(), application_name=self.application_name,
                            connect_timeout=self.connect_timeout) as startup:
                self.protocol.check_version(startup)
                self.protocol.check_enabled(startup, self.function_name)
                result = self.protocol.compile_flow(startup, self.flow, self.step_slug)
                self.protocol.register(
                    startup, worker_id=self.worker_id, function_name=self.function_name, queue_name=self.queue_name,
                    flow_slug=self.flow.slug, step_slug=self.step_slug, worker_version=self.worker_version,
                )
                self.reports_batched = self.batch_reports and self.protocol.has_batch_reports(startup)
                self._timeouts = self.protocol.step_timeouts(startup, self.flow.slug, self.step_slug)
        except BaseException:
            # Nothing was registered; the worker is finished, not stuck in 'starting'.
            self.state = "stopped"
            self.stop_reason = self.stop_reason or "startup failed"
            self._stopped.set()
            raise
        self._start_budget = min(self._timeouts.values(), default=DEFAULT_TIMEOUT) / 2
        log.info(
            "worker %s started: flow=%s step=%s queue=%s function=%s compile=%s protocol=%s reports=%s",
            self.worker_id, self.flow.slug, self.step_slug or "-", self.queue_name, self.function_name,
            result.get("status"), self.protocol.version, "batched" if self.reports_batched else "one per call",
        )
        self._pool = ConnectionPool(
            db.connection_string(self._target(), application_name=self.application_name,
                                 connect_timeout=self.connect_timeout),
            min_size=1,
            max_size=self.max_concurrent + 2,
            # no server-side prepared statements: a transaction-mode pooler may stand between
            kwargs={"autocommit": True, "prepare_threshold": db.POOLER_SAFE_PREPARE},
            open=True,
            name=f"pgflow-worker-{self.worker_id[:8]}",
        )
        self._executor = ThreadPoolExecutor(max_workers=self.max_concurrent, thread_name_prefix="pgflow-task")
        self.state = "running"
        if self.reports_batched:
            self._reporter = threading.Thread(target=self._report_loop, name="pgflow-report", daemon=True)
            self._reporter.start()
        self._thread = threading.Thread(target=self._main_loop, name="pgflow-poll", daemon=True)
        self._thread.start()

    def _target(self) -> db.Target:
        return db.Target(self.conninfo, f"worker {self.function_name}")

    def stop(self, reason: str = "stop requested") -> None:
        """Ask the worker to stop polling and drain (returns at once; see :meth:`join`)."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the worker has fully stopped. Returns False on timeout."""
        return self._stopped.wait(timeout)

    def tasks_in_flight(self) -> int:
        """Claimed tasks whose handler has not finished (waiting for a handler thread or running)."""
        return self._in_flight()

    def run(self) -> int:
        """Start, then block until stopped; SIGTERM/SIGINT trigger a graceful drain.

        Returns:
            0 after a clean stop, 1 after a fatal claim outcome.
        """
        def on_signal(signum: int, _frame: Any) -> None:
            log.info("received %s: draining in-flight tasks", signal.Signals(signum).name)
            self.stop(f"signal {signal.Signals(signum).name}")

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            while not self.join(0.5):
                pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
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
                            if self.protocol.heartbeat(conn, self.worker_id, **self._route()):
                                log.info("worker %s deprecated: stops polling and drains", self.worker_id)
                                self.stop("deprecated")
                                break
                        next_heartbeat = now + self.heartbeat_interval
                    capacity = self._capacity()
                    if capacity == 0:
                        self._wait_for_capacity(min(self.heartbeat_interval, 1.0))
                        continue
                    self._poll_once(min(capacity, self.batch_size))
                    backoff = 0.5
                except psycopg.Error as exc:
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
                conn, queue_name=self.queue_name, vt=self.poll_vt, qty=qty,
                # a long poll never outlasts the heartbeat interval by much: the fence and coverage
                # tell a live worker from a dead one by its heartbeat age
                max_poll_seconds=min(self.max_poll_seconds, max(1, math.ceil(self.heartbeat_interval))),
                poll_interval_ms=self.poll_interval_ms,
            )
            self.stats.add(polls=1, messages_read=len(message_ids))
            if not message_ids:
                return
            if self._stop.is_set():
                # Stopping: take no new work, but do not hide it either until the read's
                # visibility timeout ends; another worker can claim it right away.
                self._release_quietly(conn, message_ids)
                return
            try:
                outcome = self.protocol.claim(
                    conn, flow_slug=self.flow.slug, step_slug=self.step_slug, queue_name=self.queue_name,
                    message_ids=message_ids, worker_id=self.worker_id,
                )
            except psycopg.Error as exc:
                if getattr(exc, "sqlstate", None) in (SQLSTATE_PROTOCOL, SQLSTATE_NOT_REGISTERED):
                    self._release_quietly(conn, message_ids)  # nothing was claimed: hand them back now
                raise
        self.stats.add(claimed=len(outcome.claimed), duplicates=len(outcome.duplicates),
                       archived=len(outcome.archived_terminal) + len(outcome.archived_foreign))
        for message_id in outcome.archived_foreign:
            log.warning("worker %s: archived foreign message %s in queue %s (not pgflow work)",
                        self.worker_id, message_id, self.queue_name)
        if outcome.fatal_reason:
            self.fatal = outcome.fatal_reason
            log.error(
                "worker %s: FATAL unsupported work in queue %s (messages %s): %s. Nothing was claimed; the batch "
                "was made visible again and function %s is paused. Stopping.",
                self.worker_id, self.queue_name, ",".join(map(str, outcome.fatal_messages)), outcome.fatal_reason,
                self.function_name,
            )
            self.stop("fatal claim outcome")
            return
        claimed_at = time.monotonic()
        for task in outcome.claimed:
            self._submit(task, claimed_at)

    def _route(self) -> dict[str, Any]:
        """The route this worker registered (heartbeats are checked against it)."""
        return {"function_name": self.function_name, "queue_name": self.queue_name,
                "flow_slug": self.flow.slug, "step_slug": self.step_slug}

    def _release_quietly(self, conn: psycopg.Connection, message_ids: list[int]) -> None:
        """Make read-but-unclaimed messages visible again; a failure only means they wait out ``poll_vt``."""
        try:
            self.protocol.release(conn, self.queue_name, message_ids)
        except psycopg.Error as exc:
            log.warning("worker %s: could not hand back messages %s (%s); they are visible again after %ss",
                        self.worker_id, ",".join(map(str, message_ids)), type(exc).__name__, self.poll_vt)

    # capacity -----------------------------------------------------------------------
    def _in_flight(self) -> int:
        """Claimed tasks not finished yet (waiting for a handler thread or running)."""
        with self._cv:
            return self._waiting + len(self._running)

    def _capacity(self) -> int:
        """How many more tasks to claim now: free handler slots plus the prefetch allowance."""
        with self._cv:
            return max(0, self.max_concurrent + self._prefetch_allowance() - self._waiting - len(self._running))

    def _prefetch_allowance(self) -> int:
        """Tasks that may wait for a slot: those expected to start within the start budget (caller holds _cv)."""
        average = self._slot_seconds
        if not self.prefetch or average is None:
            return 0
        now = time.monotonic()
        longest = max((now - since for since in self._running.values()), default=0.0)
        if longest > 2 * average + 0.05:
            return 0  # a handler runs far longer than usual: when a slot frees is unknown
        rounds = int(self._start_budget // max(average, longest, 1e-4))
        return min(self.batch_size, self.max_concurrent * rounds)

    def _wait_for_capacity(self, timeout: float) -> None:
        """Wait until a handler starts or finishes (or ``timeout`` seconds, or a stop)."""
        with self._cv:
            self._cv.wait(timeout)

    def _submit(self, task: ClaimedTask, claimed_at: float) -> None:
        assert self._executor is not None
        with self._cv:
            self._waiting += 1
        future = self._executor.submit(self._execute, task, claimed_at)
        future.add_done_callback(lambda done: self._log_escaped(task, done.exception()) if not done.cancelled() else None)

    def _log_escaped(self, task: ClaimedTask, exc: BaseException | None) -> None:
        """Last line of defence: the thread pool would swallow an exception that escaped ``_execute``."""
        if exc is not None:  # pragma: no cover - _execute catches everything; kept so nothing is ever silent
            log.error("worker %s: BUG: task %s/%s/%s escaped the report path (%s); it stays started for "
                      "stalled-task recovery", self.worker_id, task.run_id, task.step_slug, task.task_index,
                      type(exc).__name__)

    # task execution -----------------------------------------------------------------
    def _execute(self, task: ClaimedTask, claimed_at: float) -> None:
        """Run one claimed task and report (or queue its report). Never raises: every attempt ends
        reported, or is logged and left ``started`` for stalled-task recovery."""
        token = next(self._tokens)
        started = time.monotonic()
        with self._cv:
            self._waiting -= 1
            self._running[token] = started
            self._cv.notify_all()
        try:
            timeout = self._timeouts.get(task.step_slug, DEFAULT_TIMEOUT)
            if started - claimed_at > timeout:
                self.stats.add(expired=1)
                log.warning("worker %s: task %s/%s/%s waited %.0fs for a handler, longer than its %ss timeout; "
                            "not run, it stays started for stalled-task recovery", self.worker_id, task.run_id,
                            task.step_slug, task.task_index, started - claimed_at, timeout)
                return
            ok, payload = self._outcome(task)
            if not ok:
                payload = storable_text(str(payload))[:MAX_ERROR_MESSAGE]
            if not self.reports_batched:
                self._report(task, ok=ok, payload=payload)
            elif not self._reports.put(PendingReport(task, ok, payload)):
                log.error("worker %s: task %s/%s/%s finished after the worker stopped reporting; it stays started "
                          "for stalled-task recovery", self.worker_id, task.run_id, task.step_slug, task.task_index)
        except BaseException as exc:  # nothing may vanish silently in the thread pool
            self.stats.add(report_errors=1)
            log.error("worker %s: could not finish task %s/%s/%s (%s); it stays started for stalled-task recovery",
                      self.worker_id, task.run_id, task.step_slug, task.task_index, type(exc).__name__)
        finally:
            with self._cv:
                seconds = time.monotonic() - self._running.pop(token)
                average = self._slot_seconds
                self._slot_seconds = seconds if average is None else (
                    average + SLOT_AVERAGE_WEIGHT * (seconds - average))
                self._cv.notify_all()

    def _outcome(self, task: ClaimedTask) -> tuple[bool, Any]:
        """Run the handler; returns ``(True, output)`` or ``(False, storable error text)``."""
        try:
            step = self.flow.get_step(task.step_slug)
        except KeyError:
            return False, f"worker has no handler for step {task.step_slug!r}"
        context = TaskContext(
            flow_slug=task.flow_slug, run_id=task.run_id, step_slug=task.step_slug, task_index=task.task_index,
            message_id=task.message_id, queue_name=task.queue_name, flow_input=task.flow_input,
            worker_id=self.worker_id,
        )
        handler_input = task.flow_input if (step.step_type == "single" and not step.dependencies) else task.input
        assert step.handler is not None  # manual steps are never claimed by a worker
        try:
            output = step.handler(handler_input, context)
        except BaseException as exc:  # the handler's failure is the task's failure, whatever it raised
            log.info("task failed: flow=%s step=%s run=%s task=%s msg=%s error=%s", task.flow_slug,
                     task.step_slug, task.run_id, task.task_index, task.message_id, type(exc).__name__)
            return False, error_text(exc)
        problem = unstorable(output)
        if problem:
            return False, f"handler output cannot be stored: {problem}"
        return True, output

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
        if not ok:
            payload = storable_text(str(payload))[:MAX_ERROR_MESSAGE]
        reshaped = 0
        for attempt in range(1, 6):
            try:
                with self._pool.connection() as conn:
                    if ok:
                        self.protocol.complete(conn, task, payload)
                    else:
                        self.protocol.fail(conn, task, payload)
                self.stats.add(completed=1) if ok else self.stats.add(failed=1)
                return
            except psycopg.OperationalError as exc:
                self.stats.add(report_errors=1)
                log.warning("could not report task %s/%s/%s (attempt %d): %s", task.run_id, task.step_slug,
                            task.task_index, attempt, type(exc).__name__)
                time.sleep(min(0.2 * 2 ** attempt, 5))
            except psycopg.errors.DatatypeMismatch as exc:
                if reshaped == STALE_ROW_TYPE_RETRIES:
                    if not self._refused(task, ok, payload, exc):
                        break
                    ok, payload = False, self._failure_text(ok, exc)
                    continue
                # 42804 "wrong record type supplied in RETURN NEXT": a migration added a column to
                # step_tasks while this call waited for its lock, and the row the function returns
                # no longer has the shape this statement expected when it started. The call was
                # rolled back (nothing recorded): the same report again is safe and succeeds.
                reshaped += 1
                self.stats.add(report_errors=1)
                log.warning("task %s/%s/%s: the task table changed during the report (%s); sending it again",
                            task.run_id, task.step_slug, task.task_index, first_line(exc))
            except Exception as exc:  # refused by the server (DataError, ...) or unsendable by the client
                if not self._refused(task, ok, payload, exc):
                    break
                ok, payload = False, self._failure_text(ok, exc)
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
        log.warning("task %s/%s/%s: %s", task.run_id, task.step_slug, task.task_index, self._reason(ok, exc))
        return ok or payload != GENERIC_FAILURE

    def _failure_text(self, ok: bool, exc: BaseException) -> str:
        """What to report instead: the refusal as the task's error, or the generic failure."""
        return self._reason(ok, exc)[:MAX_ERROR_MESSAGE] if ok else GENERIC_FAILURE

    # batched reports --------------------------------------------------------------------
    def _report_loop(self) -> None:
        """The reporter thread: send queued reports until the queue is closed and empty."""
        most = max(self.batch_size, self.max_concurrent)
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
                self._send_batch(ok, reports)
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
            self.stats.add(completed=len(reports)) if ok else self.stats.add(failed=len(reports))

    def _send_batch(self, ok: bool, reports: list[PendingReport]) -> None:
        """One ``complete_tasks`` or ``fail_tasks`` call; lost connections are retried (the calls are
        idempotent: a task already ended is a late report that changes nothing).

        Raises:
            Exception: whatever the last attempt raised.
        """
        assert self._pool is not None
        pairs = [(report.task, report.payload) for report in reports]
        for attempt in range(1, 4):
            try:
                with self._pool.connection() as conn:
                    if ok:
                        self.protocol.complete_many(conn, pairs)
                    else:
                        self.protocol.fail_many(conn, pairs)
                return
            except psycopg.OperationalError as exc:
                self.stats.add(report_errors=1)
                if attempt == 3:
                    raise
                log.warning("worker %s: could not send a batch of %d reports (attempt %d): %s", self.worker_id,
                            len(reports), attempt, type(exc).__name__)
                time.sleep(min(0.2 * 2 ** attempt, 5))

    # shutdown -------------------------------------------------------------------------
    def _drain_heartbeat(self) -> None:
        """Heartbeat while handlers finish: a draining worker is still running tasks, and the rollout
        fence (``pgflow fence``) tells a live drain from a dead worker by its heartbeat."""
        try:
            if self._pool:
                with self._pool.connection(timeout=5) as conn:
                    self.protocol.heartbeat(conn, self.worker_id, **self._route())
        except Exception as exc:  # best effort: the handlers' reports matter more
            log.warning("worker %s: heartbeat while draining failed: %s", self.worker_id, type(exc).__name__)

    def _drain(self) -> None:
        self.state = "draining"
        deadline = time.monotonic() + self.drain_timeout
        next_heartbeat = time.monotonic() + self.heartbeat_interval
        while (self._in_flight() or not self._reports.idle()) and time.monotonic() < deadline:
            if time.monotonic() >= next_heartbeat:
                self._drain_heartbeat()
                next_heartbeat = time.monotonic() + self.heartbeat_interval
            time.sleep(0.05)
        left = self._in_flight()
        if left:
            log.warning("worker %s: %d task(s) still running after %.0fs; they stay started for stalled recovery",
                        self.worker_id, left, self.drain_timeout)
        if self._executor:
            self._executor.shutdown(wait=left == 0, cancel_futures=True)
        self._reports.close()
        if self._reporter is not None:
            # sends what is still queued (reports of handlers that finished at the deadline)
            self._reporter.join(max(5.0, deadline - time.monotonic()))
        try:
            if self._pool and not self._disowned:
                with self._pool.connection(timeout=10) as conn:
                    self.protocol.stopped(conn, self.worker_id)
        except Exception as exc:  # stopping must not raise
            log.warning("worker %s: could not mark itself stopped: %s", self.worker_id, type(exc).__name__)
        finally:
            if self._pool:
                self._pool.close()
            self.state = "stopped"
            log.info("worker %s stopped (%s): %s", self.worker_id, self.stop_reason or "-", self.stats.snapshot())
            self._stopped.set()

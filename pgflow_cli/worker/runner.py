"""The reference worker: compile, register, heartbeat, poll, claim, run handlers, report.

Lifecycle (states: created -> starting -> running -> draining -> stopped):

1. **starting**: check the protocol version, compile the flow (``ensure_flow_compiled``),
   register the worker row. Any refusal (protocol mismatch, fenced function, shape
   mismatch) raises before anything was registered or polled.
2. **running**: one poll thread long-polls the worker's queue for at most as many messages
   as there are free handler slots, claims them, and hands each claimed task to a thread
   pool of ``max_concurrent`` handlers. Every ``heartbeat_interval`` seconds it records a
   heartbeat; a deprecated worker stops polling.
3. **draining**: no more polling; in-flight handlers finish and report (up to
   ``drain_timeout`` seconds) while heartbeats go on, so a draining worker is told apart
   from a dead one (``pgflow fence`` waits for the first and reports the second). Triggered by :meth:`Worker.stop`, SIGTERM/SIGINT in
   :meth:`Worker.run`, deprecation, or a fatal claim outcome.
4. **stopped**: the worker row is marked stopped. Tasks whose handlers were still running
   stay ``started`` and are recovered by stalled-task recovery.

Logs carry flow, step, run, task index, queue and message ids only, never inputs,
outputs or message bodies. Database errors while polling are retried with backoff.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from pgflow_cli.db import first_line
from pgflow_cli.worker.flow import Flow, TaskContext
from pgflow_cli.worker.protocol import ClaimedTask, LATEST, WorkerStartupError

log = logging.getLogger("pgflow.worker")

MAX_ERROR_MESSAGE = 2000
"""Characters of a handler's error kept in ``step_tasks.error_message``."""

GENERIC_FAILURE = "the handler failed and its error message could not be stored"


def error_text(exc: BaseException) -> str:
    """The text stored for a failed handler: ``Type: message``, NUL escaped, at most 2000 characters."""
    return f"{type(exc).__name__}: {exc}".replace("\x00", "\\x00")[:MAX_ERROR_MESSAGE]


def unstorable(output: Any) -> str | None:
    """Why PostgreSQL's jsonb could not hold ``output`` (``None`` when it can).

    Rejects what Python's json accepts but jsonb does not: NaN and Infinity, and the NUL
    character (``\\u0000``) in any string; and anything json cannot encode at all.
    """
    try:
        text = json.dumps(output, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return str(exc)
    if "\\u0000" in text:
        return "it contains a NUL character (\\u0000), which PostgreSQL cannot store"
    return None


@dataclass
class WorkerStats:
    """Counters for tests, benchmarks and the final log line."""

    polls: int = 0
    messages_read: int = 0
    claimed: int = 0
    completed: int = 0
    failed: int = 0
    duplicates: int = 0
    archived: int = 0
    report_errors: int = 0
    poll_errors: int = 0
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
        batch_size: most messages read per poll.
        poll_vt: seconds a read message stays invisible before the claim extends it.
        max_poll_seconds: long-poll duration of one read, seconds.
        poll_interval_ms: pause between empty reads inside one long poll, milliseconds.
        heartbeat_interval: seconds between heartbeats.
        drain_timeout: seconds to wait for in-flight handlers when stopping.
        worker_id: UUID of the worker row (random by default).
        application_name: ``application_name`` of its connections.
    """

    def __init__(
        self,
        flow: Flow,
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
        self.queue_name = self.protocol.queue_name(flow.slug, step_slug)
        self.stats = WorkerStats()
        self.state = "created"
        self.stop_reason: str | None = None
        self.fatal: str | None = None
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._slots = threading.Semaphore(max_concurrent)
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        self._pool: ConnectionPool | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._thread: threading.Thread | None = None

    # lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        """Check protocol, compile, register, then start polling in a background thread.

        Order: protocol version, fence (a disabled function is refused before its flow is
        compiled, so a restarted old worker never recreates a dropped flow), compilation,
        registration (which checks the fence again, atomically).

        Raises:
            WorkerStartupError: protocol mismatch, fenced function or shape mismatch;
                nothing was registered or polled.
            psycopg.Error: the database could not be reached; the worker is then stopped too.
        """
        if self.state != "created":
            raise RuntimeError(f"worker already {self.state}")
        self.state = "starting"
        try:
            with psycopg.connect(self.conninfo, autocommit=True, application_name=self.application_name) as startup:
                self.protocol.check_version(startup)
                self.protocol.check_enabled(startup, self.function_name)
                result = self.protocol.compile(startup, self.flow.slug, self.flow.shape(), self.step_slug)
                self.protocol.register(
                    startup, worker_id=self.worker_id, function_name=self.function_name, queue_name=self.queue_name,
                    flow_slug=self.flow.slug, step_slug=self.step_slug,
                )
        except BaseException:
            # Nothing was registered; the worker is finished, not stuck in 'starting'.
            self.state = "stopped"
            self.stop_reason = self.stop_reason or "startup failed"
            self._stopped.set()
            raise
        log.info(
            "worker %s started: flow=%s step=%s queue=%s function=%s compile=%s protocol=%s",
            self.worker_id, self.flow.slug, self.step_slug or "-", self.queue_name, self.function_name,
            result.get("status"), self.protocol.version,
        )
        self._pool = ConnectionPool(
            self.conninfo,
            min_size=1,
            max_size=self.max_concurrent + 2,
            kwargs={"autocommit": True, "application_name": self.application_name},
            open=True,
            name=f"pgflow-worker-{self.worker_id[:8]}",
        )
        self._executor = ThreadPoolExecutor(max_workers=self.max_concurrent, thread_name_prefix="pgflow-task")
        self.state = "running"
        self._thread = threading.Thread(target=self._main_loop, name="pgflow-poll", daemon=True)
        self._thread.start()

    def stop(self, reason: str = "stop requested") -> None:
        """Ask the worker to stop polling and drain (returns at once; see :meth:`join`)."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the worker has fully stopped. Returns False on timeout."""
        return self._stopped.wait(timeout)

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
                            if self.protocol.heartbeat(conn, self.worker_id):
                                log.info("worker %s deprecated: stops polling and drains", self.worker_id)
                                self.stop("deprecated")
                                break
                        next_heartbeat = now + self.heartbeat_interval
                    free = self._free_slots()
                    if free == 0:
                        self._wait_for_slot(min(self.heartbeat_interval, 1.0))
                        continue
                    self._poll_once(min(free, self.batch_size))
                    backoff = 0.5
                except psycopg.Error as exc:
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
                max_poll_seconds=self.max_poll_seconds, poll_interval_ms=self.poll_interval_ms,
            )
            self.stats.add(polls=1, messages_read=len(message_ids))
            if not message_ids:
                return
            if self._stop.is_set():
                # Stopping: take no new work, but do not hide it either until the read's
                # visibility timeout ends; another worker can claim it right away.
                self.protocol.release(conn, self.queue_name, message_ids)
                return
            outcome = self.protocol.claim(
                conn, flow_slug=self.flow.slug, step_slug=self.step_slug, queue_name=self.queue_name,
                message_ids=message_ids, worker_id=self.worker_id,
            )
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
        for task in outcome.claimed:
            self._submit(task)

    def _free_slots(self) -> int:
        with self._in_flight_lock:
            return self.max_concurrent - self._in_flight

    def _wait_for_slot(self, timeout: float) -> None:
        if self._slots.acquire(timeout=timeout):
            self._slots.release()

    def _submit(self, task: ClaimedTask) -> None:
        assert self._executor is not None
        self._slots.acquire()
        with self._in_flight_lock:
            self._in_flight += 1
        self._executor.submit(self._execute, task)

    # task execution -----------------------------------------------------------------
    def _execute(self, task: ClaimedTask) -> None:
        try:
            step = self.flow.get_step(task.step_slug)
            context = TaskContext(
                flow_slug=task.flow_slug, run_id=task.run_id, step_slug=task.step_slug, task_index=task.task_index,
                message_id=task.message_id, queue_name=task.queue_name, flow_input=task.flow_input,
                worker_id=self.worker_id,
            )
            handler_input = task.flow_input if (step.step_type == "single" and not step.dependencies) else task.input
            try:
                output = step.handler(handler_input, context)
            except Exception as exc:  # the handler's failure is the task's failure
                self._report(task, ok=False, payload=error_text(exc))
                log.info("task failed: flow=%s step=%s run=%s task=%s msg=%s error=%s", task.flow_slug,
                         task.step_slug, task.run_id, task.task_index, task.message_id, type(exc).__name__)
                return
            problem = unstorable(output)
            if problem:
                self._report(task, ok=False, payload=f"handler output cannot be stored: {problem}")
                return
            self._report(task, ok=True, payload=output)
        except KeyError:
            self._report(task, ok=False, payload=f"worker has no handler for step {task.step_slug!r}")
        finally:
            with self._in_flight_lock:
                self._in_flight -= 1
            self._slots.release()

    def _report(self, task: ClaimedTask, *, ok: bool, payload: Any) -> None:
        """Send complete/fail; retry transient errors; never leave a refused report unreported.

        A result the database refuses (a data error) turns into a failure of the task with the
        database's reason, so the attempt always ends; only lost connections are retried.
        """
        assert self._pool is not None
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
            except (psycopg.DataError, psycopg.ProgrammingError) as exc:
                self.stats.add(report_errors=1)
                reason = f"the database refused the task's {'output' if ok else 'error message'}: {first_line(exc)}"
                log.warning("task %s/%s/%s: %s", task.run_id, task.step_slug, task.task_index, reason)
                if not ok and payload == GENERIC_FAILURE:
                    break
                ok, payload = False, (reason if ok else GENERIC_FAILURE)
        log.error("giving up reporting task %s/%s/%s; stalled-task recovery will requeue it",
                  task.run_id, task.step_slug, task.task_index)

    # shutdown -------------------------------------------------------------------------
    def _drain_heartbeat(self) -> None:
        """Heartbeat while handlers finish: a draining worker is still running tasks, and the rollout
        fence (``pgflow fence``) tells a live drain from a dead worker by its heartbeat."""
        try:
            if self._pool:
                with self._pool.connection(timeout=5) as conn:
                    self.protocol.heartbeat(conn, self.worker_id)
        except Exception as exc:  # best effort: the handlers' reports matter more
            log.warning("worker %s: heartbeat while draining failed: %s", self.worker_id, type(exc).__name__)

    def _drain(self) -> None:
        self.state = "draining"
        deadline = time.monotonic() + self.drain_timeout
        next_heartbeat = time.monotonic() + self.heartbeat_interval
        while self._free_slots() < self.max_concurrent and time.monotonic() < deadline:
            if time.monotonic() >= next_heartbeat:
                self._drain_heartbeat()
                next_heartbeat = time.monotonic() + self.heartbeat_interval
            time.sleep(0.05)
        left = self.max_concurrent - self._free_slots()
        if left:
            log.warning("worker %s: %d task(s) still running after %.0fs; they stay started for stalled recovery",
                        self.worker_id, left, self.drain_timeout)
        if self._executor:
            self._executor.shutdown(wait=left == 0, cancel_futures=True)
        try:
            if self._pool:
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

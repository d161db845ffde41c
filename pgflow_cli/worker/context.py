"""What a handler knows about the task it runs (:class:`TaskContext`), and the stop signal it may
watch (:class:`StopSignal`).

Example::

    def fetch(run_input, ctx):
        for page in pages(run_input["url"]):
            if ctx.stop.is_set():                 # the worker drains, or the run already ended
                raise RetryLater(0) if ctx.stop.reason == STOP_DRAINING else FailNow(ctx.stop.reason)
            if ctx.seconds_left() < 5:            # close to the step timeout: hand over what we have
                break
            ...
        return {"pages": n, "last_try": ctx.is_last_attempt}

    async def notify(deps, ctx):
        done = await ctx.stop.wait_async(timeout=1.0)   # sleeps, but wakes up when stopped
        run_input = await ctx.flow_input_async()        # the run's input, from any step
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

STOP_DRAINING = "the worker is stopping"
"""``StopSignal.reason`` when the worker drains (SIGTERM, Ctrl-C, ``Worker.stop()``, deprecation)."""


class StopSignal:
    """Set when the task's work is no longer wanted; handlers check it (nothing is interrupted).

    It is set when the worker starts draining, and when the worker learns (at its next heartbeat,
    one query for all its in-flight tasks) that the task's run or step has ended, or that the task
    is no longer this attempt's (stalled-task recovery queued it again or gave it to another
    worker; the worker then does not report this attempt's result). A handler that
    never looks at it runs to its end as before.

    Usable from threads (:meth:`is_set`, :meth:`wait`) and from ``async def`` handlers
    (:meth:`wait_async`).

    Attributes:
        reason: why it was set (:data:`STOP_DRAINING`, ``"the run failed"``, ...), ``None`` until then.
    """

    # One is made for every task; most are never waited on, so the threading.Event is made by the
    # first wait() only.
    _shared_lock = threading.Lock()

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self.reason: str | None = None

    @property
    def _lock(self) -> threading.Lock:
        return StopSignal._shared_lock

    def is_set(self) -> bool:
        """True once the signal is set (cheap: reads a flag, no database access)."""
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """Block the calling thread until the signal is set or ``timeout`` seconds passed.

        Returns:
            whether the signal is set.
        """
        with self._lock:
            if self._set:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    async def wait_async(self, timeout: float | None = None) -> bool:
        """Wait, without blocking the event loop, until the signal is set or ``timeout`` seconds passed.

        Returns:
            whether the signal is set.
        """
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._set:
                return True
            self._waiters.append((loop, waiter))
        try:
            await asyncio.wait_for(waiter, timeout)
            return True
        except asyncio.TimeoutError:
            return self._set
        finally:
            with self._lock:
                if (loop, waiter) in self._waiters:
                    self._waiters.remove((loop, waiter))

    def set(self, reason: str) -> None:
        """Set the signal (the first reason is kept). Called by the worker; safe from any thread."""
        with self._lock:
            if self._set:
                return
            self.reason = reason
            self._set = True
            if self._event is not None:
                self._event.set()
            waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_resolve, waiter)

    def __repr__(self) -> str:
        return f"StopSignal(set, {self.reason!r})" if self.is_set() else "StopSignal(not set)"


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


_UNSET: Any = object()


class TaskContext:
    """What a handler knows about the task it runs; the second argument of every handler.

    Attributes:
        flow_slug: the concrete flow.
        run_id: the run (UUID text).
        step_slug: the step.
        task_index: zero-based task index (map element index; 0 for single steps).
        message_id: the PGMQ message id of the task.
        queue_name: the queue the message came from.
        worker_id: the worker running it.
        max_attempts: the step's effective ``max_attempts`` (the step's, else the flow's).
        stop: set when the work is no longer wanted (see :class:`StopSignal`).

    Handlers receive it from the worker; tests of a handler can build one with the keyword
    arguments (``flow_input`` given directly; ``deadline_clock``, the deadline on the monotonic
    clock, and the loaders are the worker's).
    """

    __slots__ = ("flow_slug", "run_id", "step_slug", "task_index", "message_id", "queue_name", "worker_id",
                 "_attempt", "_load_attempt", "max_attempts", "_deadline", "stop", "_deadline_clock", "_flow_input",
                 "_load", "_load_async")

    def __init__(
        self,
        *,
        flow_slug: str,
        run_id: str,
        step_slug: str,
        task_index: int = 0,
        message_id: int = 0,
        queue_name: str = "",
        worker_id: str = "",
        attempt: int | None = 1,
        max_attempts: int = 1,
        deadline: datetime | None = None,
        stop: StopSignal | None = None,
        flow_input: Any = _UNSET,
        load_flow_input: Callable[[], Any] | None = None,
        load_flow_input_async: Callable[[], Awaitable[Any]] | None = None,
        deadline_clock: float | None = None,
        load_attempt: Callable[[], int] | None = None,
    ) -> None:
        self.flow_slug = flow_slug
        self.run_id = run_id
        self.step_slug = step_slug
        self.task_index = task_index
        self.message_id = message_id
        self.queue_name = queue_name
        self.worker_id = worker_id
        self._attempt = attempt
        self._load_attempt = load_attempt
        self.max_attempts = max_attempts
        self._deadline = deadline
        self.stop = stop or StopSignal()
        # the same moment on the monotonic clock: a wall-clock step must not move it
        self._deadline_clock = deadline_clock if deadline_clock is not None else (
            time.monotonic() + ((deadline or datetime.now(timezone.utc)) - datetime.now(timezone.utc)).total_seconds())
        self._flow_input = flow_input
        self._load = load_flow_input
        self._load_async = load_flow_input_async

    @property
    def attempt(self) -> int:
        """This attempt's number, from 1 (the task's ``attempts_count`` after the claim). The worker
        reads it for all tasks of one claim at the first request (one query), so handlers that never
        ask cost nothing.

        Raises:
            psycopg.Error: the worker could not read it (the database is unreachable).
        """
        if self._attempt is None:
            self._attempt = self._load_attempt() if self._load_attempt is not None else 1
        return self._attempt

    @property
    def is_last_attempt(self) -> bool:
        """True when a failure of this attempt exhausts the task (``attempt >= max_attempts``): the
        place to apply a domain's final outcome in the attempt's own transaction."""
        return self.attempt >= self.max_attempts

    @property
    def deadline(self) -> datetime:
        """When the step's effective timeout ends, counted from the claim (aware, UTC); after it the
        task's message becomes visible again and another worker may take it."""
        if self._deadline is None:
            self._deadline = datetime.now(timezone.utc) + timedelta(seconds=self.seconds_left())
        return self._deadline

    def seconds_left(self) -> float:
        """Seconds until :attr:`deadline` (negative once it has passed)."""
        return self._deadline_clock - time.monotonic()

    @property
    def flow_input(self) -> Any:
        """The run's input, for every step (a root single step also gets it as its input).

        Read from the database the first time a task of the run asks for it, then kept by the
        worker for the run's later tasks; never carried in queue messages. Treat it as read-only:
        tasks of one run share the object. An ``async def`` handler should use
        :meth:`flow_input_async`, which does not block the event loop on that first read.
        """
        if self._flow_input is _UNSET:
            if self._load is None:
                raise LookupError(f"no run input is available for run {self.run_id}")
            self._flow_input = self._load()
        return self._flow_input

    async def flow_input_async(self) -> Any:
        """:attr:`flow_input` without blocking the event loop (the first read runs in a thread)."""
        if self._flow_input is _UNSET and self._load_async is not None:
            self._flow_input = await self._load_async()
        return self.flow_input

    def __repr__(self) -> str:
        attempt = "?" if self._attempt is None else self._attempt
        return (f"TaskContext(flow={self.flow_slug!r}, step={self.step_slug!r}, run={self.run_id!r}, "
                f"task={self.task_index}, attempt={attempt}/{self.max_attempts})")


class RunInputs:
    """The inputs of the runs a worker's handlers asked for, each read once and kept, most
    recently used first, for at most ``size`` runs (:attr:`TaskContext.flow_input`).

    Tasks of one run that ask at the same time wait for the one read in flight; a read that
    fails is not kept (the next task asks again).

    Args:
        load: reads one run's input from the database (``run_id`` -> input).
        size: runs kept (at least 1).
    """

    def __init__(self, load: Callable[[str], Any], size: int) -> None:
        self._load = load
        self.size = max(1, size)
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Pending] = OrderedDict()
        self.reads = 0
        """Reads from the database so far."""

    def remember(self, run_id: str, value: Any) -> None:
        """Keep an input the worker already has (a root single step's claim carries it)."""
        with self._lock:
            if run_id not in self._entries:
                self._store(run_id, _Pending(value))

    def get(self, run_id: str) -> Any:
        """The run's input, read on the first request (blocks the calling thread meanwhile).

        Raises:
            Exception: what the read raised (not kept).
        """
        with self._lock:
            entry = self._entries.get(run_id)
            owner = entry is None
            if entry is None:
                entry = _Pending()
                self._store(run_id, entry)
                self.reads += 1
            else:
                self._entries.move_to_end(run_id)
        if owner:
            try:
                entry.resolve(self._load(run_id))
            except BaseException as exc:
                with self._lock:
                    if self._entries.get(run_id) is entry:
                        del self._entries[run_id]
                entry.fail(exc)
                raise
        return entry.result()

    def _store(self, run_id: str, entry: _Pending) -> None:
        self._entries[run_id] = entry
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)


class _Pending:
    """One run input: being read (``done`` set once read or failed), or known from the start."""

    def __init__(self, *value: Any) -> None:
        self._done: threading.Event | None = None if value else threading.Event()
        self._value: Any = value[0] if value else None
        self._error: BaseException | None = None

    def resolve(self, value: Any) -> None:
        self._value = value
        if self._done is not None:
            self._done.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        if self._done is not None:
            self._done.set()

    def result(self) -> Any:
        if self._done is not None:
            self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value

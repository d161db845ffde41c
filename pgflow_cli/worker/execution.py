"""Where handlers run: a pool of daemon threads for ``def`` handlers, one event loop in its own
thread for ``async def`` handlers, and the slots both kinds share.

Both are daemon threads on purpose. A worker that stops with handlers still running (the drain
timeout passed, or a second Ctrl-C) leaves those tasks to stalled-task recovery and must be able
to end its process: the standard ``ThreadPoolExecutor`` joins its threads when the interpreter
exits, so one handler stuck in a network call would keep the process alive after ``Worker.run()``
returned.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections import deque
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

from typing_extensions import ParamSpec

P = ParamSpec("P")
T = TypeVar("T")


class DaemonThreads(Executor):
    """A thread pool of at most ``most`` daemon threads, started as work arrives.

    Args:
        most: the most threads running at once (at least 1).
        name: prefix of the threads' names.
    """

    def __init__(self, most: int, name: str) -> None:
        self.most = max(1, most)
        self.name = name
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]] | None] \
            = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for work, under _lock
        self._threads: list[threading.Thread] = []
        self._numbers = itertools.count(1)
        self._shutdown = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` in one of the threads; returns its future.

        Raises:
            RuntimeError: after :meth:`shutdown`.
        """
        future: Future[T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError(f"{self.name}: cannot take work after shutdown")
            self._work.put((future, fn, args, kwargs))
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self.most:
                thread = threading.Thread(target=self._serve, name=f"{self.name}-{next(self._numbers)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

    def _serve(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            del item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # handed to whoever waits for the future
                    future.set_exception(exc)
            del future, fn, args, kwargs
            with self._lock:
                self._idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more work; with ``cancel_futures``, drop what has not started; with ``wait``,
        wait for the threads to finish what they run (without it they are left running)."""
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while True:
                    try:
                        item = self._work.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        item[0].cancel()
            for _ in self._threads:
                self._work.put(None)
            threads = list(self._threads)
        if wait:
            for thread in threads:
                thread.join()


class EventLoopThread:
    """One asyncio event loop running in a daemon thread, for ``async def`` handlers.

    Args:
        name: the thread's name.
    """

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coroutine`` on the loop as a task; returns a thread-safe future of its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def cancel_all(self, grace: float) -> tuple[int, int]:
        """Cancel every task on the loop and wait up to ``grace`` seconds for them to end.

        Returns:
            ``(cancelled, still_running)``: tasks that were cancelled, and those of them that had
            not ended after ``grace`` (a handler that catches the cancellation and goes on).
        """
        if not self._thread.is_alive():
            return 0, 0

        async def cancel() -> tuple[int, int]:
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            if not tasks:
                return 0, 0
            _done, pending = await asyncio.wait(tasks, timeout=grace)
            return len(tasks), len(pending)

        try:
            return asyncio.run_coroutine_threadsafe(cancel(), self.loop).result(grace + 5)
        except Exception:  # the loop stopped meanwhile, or did not answer: nothing more to do
            return 0, 0

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop and its thread; the loop is closed once its thread has ended."""
        if self.loop.is_closed():
            return
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:  # already closed
            return
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


class Slots:
    """``size`` handler slots shared by threads and coroutines: a ``def`` handler's thread and an
    ``async def`` handler's task each hold one while the handler runs, so both kinds together
    never run more than ``size`` at once. Waiters get slots in arrival order.

    Args:
        size: how many (at least 1).
    """

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self._free = self.size
        self._lock = threading.Lock()
        self._waiters: deque[threading.Event | tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    def acquire(self) -> None:
        """Take a slot, blocking the calling thread until one is free."""
        with self._lock:
            if self._free and not self._waiters:
                self._free -= 1
                return
            granted = threading.Event()
            self._waiters.append(granted)
        granted.wait()

    async def acquire_async(self) -> None:
        """Take a slot, waiting on the running event loop (not blocking it) until one is free."""
        loop = asyncio.get_running_loop()
        granted: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._free and not self._waiters:
                self._free -= 1
                return
            self._waiters.append((loop, granted))
        try:
            await granted
        except asyncio.CancelledError:
            with self._lock:
                waiting = (loop, granted) in self._waiters
                if waiting:
                    self._waiters.remove((loop, granted))
            if not waiting and granted.done() and not granted.cancelled():
                self.release()  # handed over just as it was cancelled: pass it on
            raise

    def release(self) -> None:
        """Give a slot back: to the longest waiter, else to the free ones."""
        with self._lock:
            if not self._waiters:
                self._free += 1
                return
            waiter = self._waiters.popleft()
        if isinstance(waiter, threading.Event):
            waiter.set()
            return
        loop, granted = waiter
        try:
            loop.call_soon_threadsafe(self._grant, granted)
        except RuntimeError:  # its loop is closed: nobody waits there any more
            self.release()

    def _grant(self, granted: asyncio.Future[None]) -> None:
        if granted.done():  # cancelled before the slot arrived
            self.release()
        else:
            granted.set_result(None)

    def in_use(self) -> int:
        """Slots held now."""
        with self._lock:
            return self.size - self._free

"""Reports of finished tasks on their way to the database: the queue between the handler threads
and the worker's one reporter thread (the "Reports" paragraph of pgflow_cli/worker/runner.py).

A handler thread that has finished a task puts its report here and takes the next task; the
reporter thread takes everything waiting (up to a batch limit) in one go and sends it in as few
calls as the database allows. Nothing waits for a batch to fill: a lone report leaves as soon
as the reporter is free, and reports that finish while a call is in flight travel together in
the next one. The queue is bounded, so a database that falls behind holds the handler threads
(and, through them, the claims) back instead of piling up reports in memory.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from pgflow_cli.worker.protocol import ClaimedTask


@dataclass(frozen=True)
class PendingReport:
    """One finished attempt: ``ok`` with the output, or not ``ok`` with the storable error text."""

    task: ClaimedTask
    ok: bool
    payload: Any


class ReportQueue:
    """A bounded FIFO of :class:`PendingReport` with one consumer.

    Args:
        limit: most reports waiting at once (at least 1); :meth:`put` blocks beyond it.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._items: deque[PendingReport] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._busy = False

    def put(self, report: PendingReport) -> bool:
        """Queue ``report``, waiting while the queue is full.

        Returns:
            False when the queue was closed (the worker stopped): the report was not queued.
        """
        with self._cv:
            while len(self._items) >= self.limit and not self._closed:
                self._cv.wait()
            if self._closed:
                return False
            self._items.append(report)
            self._cv.notify_all()
            return True

    def offer(self, report: PendingReport) -> bool | None:
        """Queue ``report`` if there is room, without waiting (for an event loop, which must not block).

        Returns:
            True when queued, None when the queue is full (call :meth:`put` from a thread), False
            when the queue was closed (the worker stopped).
        """
        with self._cv:
            if self._closed:
                return False
            if len(self._items) >= self.limit:
                return None
            self._items.append(report)
            self._cv.notify_all()
            return True

    def take(self, most: int) -> list[PendingReport] | None:
        """Wait for at least one report; return up to ``most`` of them, oldest first.

        Returns:
            ``None`` once the queue is closed and empty (the consumer ends). Until :meth:`done`
            is called the queue counts as busy (see :meth:`idle`).
        """
        with self._cv:
            while not self._items and not self._closed:
                self._cv.wait()
            if not self._items:
                return None
            batch = [self._items.popleft() for _ in range(min(most, len(self._items)))]
            self._busy = True
            self._cv.notify_all()
            return batch

    def done(self) -> None:
        """The consumer has finished with the batch :meth:`take` returned."""
        with self._cv:
            self._busy = False
            self._cv.notify_all()

    def idle(self) -> bool:
        """True when nothing is waiting and no batch is being sent."""
        with self._cv:
            return not self._items and not self._busy

    def close(self) -> None:
        """Refuse new reports; the consumer still gets what is queued, then ``None``."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

"""Waits that keep saying they are waiting: a command that waits for a state (coverage, a drain, new
worker heartbeats) reports its progress at least every :data:`PROGRESS_EVERY` seconds, whatever its
``--interval``, so a person or a CI log never watches a silent command."""

from __future__ import annotations

import time
from collections.abc import Callable

PROGRESS_EVERY = 5.0
"""Seconds: the longest a waiting command stays silent."""


def pause(seconds: float, tick: Callable[[], None] | None = None, *, every: float = PROGRESS_EVERY,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
    """Sleep ``seconds``, calling ``tick`` after each ``every`` seconds of it (not at its end: the
    caller looks again then and reports what it sees).

    Args:
        seconds: how long to wait (0 or less: not at all).
        tick: what to call while waiting, e.g. print the last progress line again; None for nothing.
        every: seconds between ticks.
        clock: monotonic seconds (tests pass a fake one).
        sleep: the sleep function (tests pass a fake one).
    """
    end = clock() + seconds
    while True:
        left = end - clock()
        if left <= 0:
            return
        sleep(min(left, every))
        if tick is not None and clock() < end:
            tick()


class Pacer:
    """When a progress line is worth printing: whenever what it says changed, and at least every
    ``every`` seconds even when nothing did (a wait that says nothing looks hung).

    Args:
        every: seconds.
        clock: monotonic seconds.
    """

    def __init__(self, every: float = PROGRESS_EVERY, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self.clock = clock
        self._last: tuple[object, float] | None = None

    def due(self, key: object) -> bool:
        """True when a line about state ``key`` should be printed now (and remembers it was)."""
        now = self.clock()
        if self._last is not None and self._last[0] == key and now - self._last[1] < self.every:
            return False
        self._last = (key, now)
        return True

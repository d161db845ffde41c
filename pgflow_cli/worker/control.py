"""Exceptions a handler raises to steer what happens to its task: retry later, or fail now.

Example::

    from datetime import timedelta
    from pgflow_cli.worker import FailNow, RetryLater

    def enrich(deps, ctx):
        try:
            return provider.enrich(deps["parse"])
        except RateLimited as exc:
            raise RetryLater(exc.retry_after) from exc           # seconds, a timedelta or an aware datetime
        except NotFound as exc:
            raise FailNow(f"document {deps['parse']['doc_id']} is gone") from exc

Both end the attempt as a failure whose stored error text is the exception's message (and its
cause's ``Type: message`` when raised ``from`` another exception). ``RetryLater`` checks its delay
when it is created: a negative, non-finite or too long delay, or a datetime without a time zone,
raises :class:`~pgflow_cli.worker.errors.InvalidRetryDelay` instead, which fails the attempt like
any other exception, before any database call.

What the database does with them (``fail_task``'s ``retry_delay_seconds`` and ``fail_now``,
docs/runtime.md "Retry delay and fail-now"): a retry delay replaces the step's backoff for the
next attempt while attempts remain (whole seconds, rounded up) and is ignored on the last attempt;
fail-now ends the task at once whatever attempts remain, and the step's ``when_exhausted`` applies.
Attempts are counted as for any failure. A database whose ``fail_task`` lacks them (an older
schema) gets them as ordinary failures (the step's backoff and attempt count apply), and the worker
says so in its log.
"""

from __future__ import annotations

import math
import numbers
from datetime import datetime, timedelta, timezone

from pgflow_cli.worker.errors import InvalidRetryDelay
from pgflow_cli.worker.text import describe_exception, exception_message

MAX_RETRY_DELAY = 2_147_483_647
"""The longest retry delay in seconds (about 68 years): the largest visibility offset PGMQ's
integer seconds can carry."""

RetryWhen = float | int | timedelta | datetime
"""When to retry: seconds from now (``int``/``float``), a ``timedelta``, or an aware ``datetime``."""


def _is_bool(value: object) -> bool:
    """``True``/``False`` are numbers to Python; as a delay they are a mistake."""
    return isinstance(value, bool)


class _TaskDirective(Exception):
    """What the two directives share: an optional message, and a text that names their cause."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        cause = self.__cause__
        if cause is None:
            return self.message
        described = describe_exception(cause)
        return f"{self.message} ({described})" if self.message else described


class RetryLater(_TaskDirective):
    """Fail this attempt and run the next one no earlier than ``when``.

    Args:
        when: seconds from now (``int`` or ``float``, at least 0), a ``timedelta`` (at least 0), or
            a time-zone-aware ``datetime``; a time already past means "as soon as possible". At most
            :data:`MAX_RETRY_DELAY` seconds ahead.
        message: the failure's text (default: the cause's ``Type: message`` when raised ``from``
            another exception, else empty).

    Attributes:
        at: the aware datetime given, or ``None`` for a delay.
        seconds: the delay given in seconds, or ``None`` for a datetime.

    Raises:
        InvalidRetryDelay: a negative, NaN or infinite delay, one longer than
            :data:`MAX_RETRY_DELAY`, a naive datetime, or a value of another type.
    """

    def __init__(self, when: RetryWhen, message: str = "") -> None:
        super().__init__(message)
        self.at: datetime | None = None
        self.seconds: float | None = None
        if isinstance(when, datetime):
            if when.tzinfo is None or when.utcoffset() is None:
                raise InvalidRetryDelay(
                    f"RetryLater({when.isoformat()}) has no time zone, so the moment it names is ambiguous",
                    hint="pass an aware datetime (datetime.now(timezone.utc) + ...) or a timedelta")
            ahead = (when - datetime.now(timezone.utc)).total_seconds()
            if ahead > MAX_RETRY_DELAY:
                raise InvalidRetryDelay(f"RetryLater({when.isoformat()}) is {ahead:.0f} s ahead, more than the "
                                        f"longest retry delay of {MAX_RETRY_DELAY} s")
            self.at = when
            return
        given: object = when  # checked at run time: callers are not always type-checked
        if isinstance(given, timedelta):
            seconds = given.total_seconds()
        elif isinstance(given, numbers.Real) and not _is_bool(given):
            seconds = float(given)
        else:
            raise InvalidRetryDelay(f"RetryLater() takes seconds, a timedelta or an aware datetime, "
                                    f"not {type(when).__name__}")
        if math.isnan(seconds) or math.isinf(seconds) or seconds < 0 or seconds > MAX_RETRY_DELAY:
            raise InvalidRetryDelay(f"RetryLater({when!r}): the delay must be a number of seconds from 0 to "
                                    f"{MAX_RETRY_DELAY}")
        self.seconds = seconds

    def delay(self, now: datetime | None = None) -> float:
        """Seconds from ``now`` (default: the current time) until the next attempt may run, at least 0."""
        if self.seconds is not None:
            return self.seconds
        assert self.at is not None
        return max(0.0, (self.at - (now or datetime.now(timezone.utc))).total_seconds())

    def __repr__(self) -> str:
        when = self.at.isoformat() if self.at is not None else f"{self.seconds:g}"
        return f"RetryLater({when}, {exception_message(self)!r})"


class FailNow(_TaskDirective):
    """Fail the task now, whatever attempts remain; the step's ``when_exhausted`` then decides
    (fail the run, skip the step, or skip it with its dependents).

    Args:
        message: the failure's text (default: the cause's ``Type: message`` when raised ``from``
            another exception, else empty).
    """

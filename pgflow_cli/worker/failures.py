"""A failed attempt on its way to the database and the log: its stored text, the handler's
directive (retry later, fail now), and what the database will do with it.

One attempt that fails becomes one :class:`TaskFailure`. Its ``message`` is what
``step_tasks.error_message`` stores: ``Type: message`` of the exception, storable and at most
:data:`MAX_ERROR_MESSAGE` characters, followed by the traceback when the operator asked to store
tracebacks (at most :data:`MAX_STORED_TRACEBACK` more characters). The report element sent to
``fail_task`` / ``fail_tasks`` is built from it in exactly one place,
:func:`pgflow_cli.worker.protocol.failure_report`.
"""

from __future__ import annotations

import dataclasses
import math
import traceback
from dataclasses import dataclass

from pgflow_cli.worker.control import FailNow, RetryLater
from pgflow_cli.worker.text import describe_exception, storable_text

MAX_ERROR_MESSAGE = 2000
"""Characters of a handler's error message kept in ``step_tasks.error_message``."""

MAX_STORED_TRACEBACK = 6000
"""Characters of traceback stored after the message when tracebacks are stored; the innermost
frames (the end of the text) are kept."""

GENERIC_FAILURE = "the handler failed and its error message could not be stored"
"""Reported when the database refused even the failure's own text."""


@dataclass(frozen=True)
class TaskFailure:
    """One failed attempt.

    Attributes:
        message: the text stored as the task's error (storable, bounded; with the traceback when
            tracebacks are stored).
        summary: ``Type: message`` alone (storable, bounded), for logs.
        error_type: the exception's type name, or the worker's name for a failure it found itself
            (``UnstorableOutput``, ``MissingHandler``).
        retry: the handler's ``RetryLater``, if it raised one.
        fail_now: the handler raised ``FailNow``.
        traceback: the formatted traceback, when there was an exception (for logs).
        final: whether this failure ends the task (no attempt left, or fail-now), as the worker
            judged it when the attempt failed (:meth:`RetryPolicy.next_attempt_in`); ``None`` when not
            judged (a failure the worker made of a refused report). Counted by the worker's metrics.
    """

    message: str
    summary: str
    error_type: str
    retry: RetryLater | None = None
    fail_now: bool = False
    traceback: str | None = None
    final: bool | None = None

    @classmethod
    def from_exception(cls, exc: BaseException, *, store_traceback: bool = False) -> TaskFailure:
        """The failure a handler's exception stands for (never raises)."""
        summary = storable_text(describe_exception(exc))[:MAX_ERROR_MESSAGE]
        try:
            formatted = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        except Exception:  # pragma: no cover - an exception whose formatting raises
            formatted = None
        text = summary
        if store_traceback and formatted:
            text = f"{summary}\n\n{_tail(storable_text(formatted), MAX_STORED_TRACEBACK)}"
        return cls(message=text, summary=summary, error_type=type(exc).__name__,
                   retry=exc if isinstance(exc, RetryLater) else None,
                   fail_now=isinstance(exc, FailNow), traceback=formatted)

    @classmethod
    def plain(cls, message: str, error_type: str, *, fail_now: bool = False) -> TaskFailure:
        """A failure the worker found itself (an output it cannot store, a step it does not serve);
        ``fail_now`` for one that no retry can fix."""
        text = storable_text(message)[:MAX_ERROR_MESSAGE]
        return cls(message=text, summary=text, error_type=error_type, fail_now=fail_now)

    def with_message(self, message: str) -> TaskFailure:
        """The same failure with another stored text (the database refused the first one)."""
        text = storable_text(message)[:MAX_ERROR_MESSAGE]
        return dataclasses.replace(self, message=text, summary=text)

    def asked(self) -> str | None:
        """What the handler asked for (``"to fail now"``, ``"to retry in 20s"``), or ``None``."""
        if self.fail_now:
            return "to fail now"
        if self.retry is not None:
            return f"to retry in {math.ceil(self.retry.delay())}s"
        return None


def _tail(text: str, most: int) -> str:
    """The last ``most`` characters of ``text``, from a line start, saying how much was left out."""
    if len(text) <= most:
        return text
    kept = text[-most:]
    newline = kept.find("\n")
    if 0 <= newline < len(kept) - 1:
        kept = kept[newline + 1:]
    return f"... ({len(text) - len(kept)} characters of the traceback left out)\n{kept}"


@dataclass(frozen=True)
class RetryPolicy:
    """A step's effective retry settings, as the database applies them.

    Attributes:
        max_attempts: attempts in all, the first included (the step's, else the flow's).
        base_delay: seconds; retry after attempt n waits ``floor(base_delay * 2**n)``.
        when_exhausted: ``fail``, ``skip`` or ``skip-cascade``.
    """

    max_attempts: int
    base_delay: int
    when_exhausted: str = "fail"

    def next_attempt_in(self, attempt: int, failure: TaskFailure, *, retry_control: bool) -> float | None:
        """Seconds until the task's next attempt becomes visible after ``failure`` of ``attempt``,
        or ``None`` when this failure ends the task.

        Args:
            attempt: the attempt that failed (1-based; the task's ``attempts_count``).
            failure: the failure.
            retry_control: the database honours ``RetryLater`` and ``FailNow``
                (``Protocol.has_retry_control``); when False both are ordinary failures.
        """
        if attempt >= self.max_attempts or (retry_control and failure.fail_now):
            return None
        if retry_control and failure.retry is not None:
            return math.ceil(failure.retry.delay())
        return float(math.floor(self.base_delay * 2 ** attempt))

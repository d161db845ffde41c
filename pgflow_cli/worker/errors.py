"""The errors the worker library raises on its own.

::

    WorkerError                       every error below
    ├── DefinitionError               a flow, step, handler or worker option that cannot work
    ├── InvalidRetryDelay             a RetryLater whose delay or time cannot be used
    ├── MetricsUnavailable            a metrics port without prometheus-client, or that cannot be bound
    └── WorkerStartupError            the database refused the worker's start (protocol.py)
        ├── ProtocolMismatch, WorkerFenced, FlowShapeMismatch

They are :class:`~pgflow_cli.errors.PgflowError` subclasses, so each carries ``message``, ``hint``
and ``detail``, and the ``pgflow`` command reports them with their exit code (``DefinitionError``:
2, ``WorkerStartupError``: 6) instead of a traceback. ``DefinitionError`` and ``InvalidRetryDelay``
are also ``ValueError``s: application code that builds flows from configuration can catch either.
"""

from __future__ import annotations

from pgflow_cli.errors import ExitCode, PgflowError, UsageError


class WorkerError(PgflowError):
    """Base class of the errors the worker library raises."""


class DefinitionError(WorkerError, ValueError):
    """A flow, step, handler or worker option that cannot work, found before any database access.

    Raised by :class:`~pgflow_cli.worker.Flow` building, ``with_step_queues()``, ``WorkerOptions``
    and the ``Worker`` constructors. The ``pgflow worker`` command exits 2 with it.
    """

    exit_code = ExitCode.USAGE

    @classmethod
    def from_usage(cls, error: UsageError) -> DefinitionError:
        """The same message, hint and detail from a shared rule that raised the CLI's usage error
        (the slug and queue-name rules of :mod:`pgflow_cli.naming` serve commands and the library)."""
        return cls(error.message, hint=error.hint, detail=error.detail)


class InvalidRetryDelay(WorkerError, ValueError):
    """A :class:`~pgflow_cli.worker.RetryLater` asked for a delay or time the worker cannot use:
    negative, not a number, infinite, beyond the longest delay, or a datetime without a time zone.

    Raised where the handler raises ``RetryLater``; the worker then reports the attempt as an
    ordinary failure with this error's text, before any database call.
    """


class MetricsUnavailable(WorkerError):
    """The worker was asked to serve metrics (``WorkerOptions.metrics_port``) and cannot: the
    ``metrics`` extra (prometheus-client) is not installed, or the address cannot be bound (in use,
    no such interface). Raised by ``Worker.start()`` before anything is registered; the ``pgflow
    worker`` command exits 2 with it.
    """

    exit_code = ExitCode.USAGE

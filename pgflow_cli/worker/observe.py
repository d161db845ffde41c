"""What a worker tells an observer while it runs: claims, handler times, reports, database errors.

:class:`Observer` does nothing; it is what a worker without metrics uses, so the worker's code
calls the same methods either way and imports nothing of a metrics library. The Prometheus
observer (:mod:`pgflow_cli.worker.metrics`) overrides them. Every method is called from the
worker's own threads (poll, handlers, reporter, event loop) and must not raise or block.
"""

from __future__ import annotations

from typing import Any


def sqlstate_class(exc: BaseException) -> str:
    """The two-character SQLSTATE class of a database error (``08`` connection, ``40`` transaction
    rollback, ``57`` operator intervention, ``PF`` pgflow's own), or ``none`` when the error carries
    no SQLSTATE (a connection that failed before the server answered, an error of the client)."""
    state = getattr(exc, "sqlstate", None)
    return state[:2] if isinstance(state, str) and len(state) >= 2 else "none"


class Observer:
    """The events of one worker, ignored (a worker without metrics).

    ``step`` is always the task's step slug; the flow and queue are the worker's.
    """

    def start(self, worker: Any) -> None:
        """The worker has registered and is about to poll (``worker``: the :class:`~pgflow_cli.worker.Worker`)."""

    def close(self) -> None:
        """The worker has stopped; an observer that serves anything stops serving it."""

    def polled(self, messages: int) -> None:
        """One read of the queue returned ``messages`` message ids (0: an empty poll)."""

    def round(self) -> None:
        """The poll loop waited for a free handler slot instead of reading (it is alive all the same)."""

    def claimed(self, step: str) -> None:
        """One task of ``step`` was claimed (its attempt started)."""

    def handler_finished(self, step: str, seconds: float) -> None:
        """A handler of ``step`` returned or raised after ``seconds``."""

    def reported(self, step: str, ok: bool, failure: Any = None) -> None:
        """The database recorded one attempt of ``step``: completed (``ok``), or failed with ``failure``
        (a :class:`~pgflow_cli.worker.failures.TaskFailure`)."""

    def report_batch(self, ok: bool, size: int) -> None:
        """One report call carried ``size`` completions (``ok``) or failures."""

    def database_error(self, operation: str, exc: BaseException) -> None:
        """A database call of ``operation`` (``poll``, ``report``, ``heartbeat``) raised ``exc``."""

    def heartbeat(self) -> None:
        """The database recorded a heartbeat of the worker."""

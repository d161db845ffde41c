"""How a worker runs: concurrency, polling, heartbeats, stopping, reports and failure details.

Example::

    from pgflow_cli.worker import Worker, WorkerOptions

    options = WorkerOptions(max_concurrent=50, batch_size=50, log_tracebacks=True)
    Worker(flow, dsn, function_name="scrape-worker", options=options).run()
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pgflow_cli import db
from pgflow_cli.worker.errors import DefinitionError


@dataclass(frozen=True)
class WorkerOptions:
    """The settings of one :class:`~pgflow_cli.worker.Worker` (all optional).

    Attributes:
        max_concurrent: tasks in flight at once: handler threads for ``def`` handlers, and the
            same number of slots for ``async def`` handlers on the worker's event loop.
        batch_size: most messages read per poll, and most tasks claimed beyond the free slots
            (see "Capacity" in :mod:`pgflow_cli.worker.runner`).
        poll_vt: seconds a read message stays invisible until its claim sets its visibility. ``None``
            (the default): the served steps' effective timeout + 2 s when they all have the same
            one (on protocol 2 the claim then keeps the read's visibility instead of writing the
            message a second time; docs/claim-protocol.md), else 5 s. A message read but never
            claimed (the worker died in between) stays hidden that long.
        max_poll_seconds: long-poll duration of one read, seconds.
        poll_interval_ms: pause between empty reads inside one long poll, milliseconds.
        heartbeat_interval: seconds between heartbeats; also how often the worker checks, in one
            query, whether the runs of its in-flight tasks are still going (the stop signal).
        drain_timeout: seconds to wait for in-flight handlers when stopping; tasks still running
            then are left to stalled-task recovery.
        application_name: ``application_name`` of the worker's connections.
        connect_timeout: seconds libpq waits for the server on every connection the worker opens.
        worker_version: free text reported at registration (``workers.worker_version``, shown by
            ``pgflow coverage``); ignored by databases that do not record it.
        batch_reports: send reports through ``complete_tasks`` / ``fail_tasks`` when the database
            has them; False: one call per task.
        prefetch: claim beyond the free slots when the tasks are expected to start well within
            their visibility window; False: read only as many messages as slots are free.
        log_tracebacks: failure log lines carry the handler's traceback.
        store_tracebacks: the task's stored error (``step_tasks.error_message``) carries the
            traceback after the message, shortened to :data:`~pgflow_cli.worker.failures.MAX_STORED_TRACEBACK`
            characters (the innermost frames are kept).
        run_inputs_cached: runs whose input the worker keeps after a handler asked for it
            (``TaskContext.flow_input``), most recently used first.
        metrics_port: serve Prometheus metrics and ``/healthz`` on this TCP port (0: any free
            port, see ``Worker.metrics_address``); ``None``: no metrics, and ``prometheus_client``
            (the ``metrics`` extra) is not imported. docs/observability.md lists the metrics.
        metrics_host: the address the metrics server listens on (``127.0.0.1``: this machine
            only; ``0.0.0.0``: every interface, for a scraper elsewhere).

    Raises:
        DefinitionError: a count below 1, a negative or non-finite duration, a metrics port outside
            0-65535.
    """

    max_concurrent: int = 10
    batch_size: int = 10
    poll_vt: int | None = None
    max_poll_seconds: int = 2
    poll_interval_ms: int = 100
    heartbeat_interval: float = 5.0
    drain_timeout: float = 60.0
    application_name: str = "pgflow-worker"
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT
    worker_version: str | None = None
    batch_reports: bool = True
    prefetch: bool = True
    log_tracebacks: bool = False
    store_tracebacks: bool = False
    run_inputs_cached: int = 1024
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        for name in ("max_concurrent", "batch_size", "poll_vt", "max_poll_seconds", "run_inputs_cached"):
            value = getattr(self, name)
            if name == "poll_vt" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise DefinitionError(f"worker option {name} must be a whole number of at least 1, got {value!r}")
        for name in ("heartbeat_interval", "drain_timeout", "poll_interval_ms", "connect_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise DefinitionError(f"worker option {name} must be a finite number of at least 0, got {value!r}")
        port = self.metrics_port
        if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535):
            raise DefinitionError(f"worker option metrics_port must be a TCP port from 0 to 65535 (0: any free "
                                  f"port) or None, got {port!r}")
        if not isinstance(self.metrics_host, str) or not self.metrics_host:
            raise DefinitionError(f"worker option metrics_host must be an address to listen on, got {self.metrics_host!r}")
        if self.heartbeat_interval == 0:
            raise DefinitionError("worker option heartbeat_interval must be more than 0 seconds")

"""Prometheus metrics of one worker, and the small HTTP server that serves them (docs/observability.md).

Needs the ``metrics`` extra (``prometheus-client``). A worker imports this module only when it
was given a metrics port (``WorkerOptions.metrics_port``); otherwise it uses the silent
:class:`~pgflow_cli.worker.observe.Observer` and ``prometheus_client`` is never imported.

Every worker has its own ``CollectorRegistry`` and its own server, so several workers in one
process never share a time series. Labels are bounded: the worker's route (``flow``, ``step``,
``queue``; ``step`` is empty for a whole-flow worker's own gauges), the task's step, an outcome,
an operation, a SQLSTATE class, a state. Run ids, message ids and worker ids are never labels:
each would make a new series per run (Prometheus adds the scraped ``instance`` itself).

Example::

    options = WorkerOptions(metrics_port=9464)      # 0: any free port, see Worker.metrics_address
    Worker(flow, dsn, function_name="scrape-worker", options=options).run()
    # curl -s localhost:9464/metrics; curl -s localhost:9464/healthz
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pgflow_cli.worker.observe import Observer, sqlstate_class

STATES = ("starting", "running", "draining", "stopped", "paused")
"""Values of ``pgflow_worker_state``'s ``state`` label: ``paused`` is a worker that stopped (or is
stopping) after a fatal claim, which paused its function in the database."""

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)
"""Seconds: handlers from a few milliseconds (a transform) to 15 minutes (a long call)."""

BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500)
"""Reports per call: 1 is a lone report, the largest a full batch of a wide worker."""

HealthCheck = Callable[[], tuple[bool, str]]
"""Whether the process is healthy, and one line saying why (the body of ``/healthz``)."""


class _QuietHandler(WSGIRequestHandler):
    """No access log: scrapes every few seconds would drown the worker's own lines."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return


class MetricsServer:
    """Serves ``/metrics`` (Prometheus text of ``registry``) and ``/healthz`` (also ``/health``:
    200 when ``health`` says so, 503 otherwise) over HTTP, in a daemon thread.

    Args:
        registry: what ``/metrics`` serves.
        health: the health check of ``/healthz``.
        host: the address to listen on (``127.0.0.1``: this machine only; ``0.0.0.0``: every IPv4
            interface; ``::`` every IPv6 one).
        port: the TCP port; 0 picks a free one (see :attr:`address`).

    Attributes:
        address: ``(host, port)`` actually bound.

    Raises:
        OSError: the address cannot be bound (in use, no such interface, no permission).
    """

    def __init__(self, registry: CollectorRegistry, health: HealthCheck, *, host: str, port: int) -> None:
        metrics_app = make_wsgi_app(registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO") or "/"
            if path in ("/healthz", "/health"):
                ok, why = health()
                start_response("200 OK" if ok else "503 Service Unavailable",
                               [("Content-Type", "text/plain; charset=utf-8")])
                return [f"{why}\n".encode()]
            if path in ("/metrics", "/"):
                result: Iterable[bytes] = metrics_app(environ, start_response)
                return result
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found: try /metrics or /healthz\n"]

        server_class: type[WSGIServer] = ThreadingWSGIServer
        if ":" in host:
            server_class = type("ThreadingWSGIServerV6", (ThreadingWSGIServer,), {"address_family": socket.AF_INET6})
        self._server = make_server(host, port, app, server_class=server_class, handler_class=_QuietHandler)
        bound = self._server.server_address
        self.address: tuple[str, int] = (str(bound[0]), int(bound[1]))
        self._thread = threading.Thread(target=self._server.serve_forever, name="pgflow-metrics", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """``http://host:port`` of the server (IPv6 hosts in brackets)."""
        host, port = self.address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def close(self) -> None:
        """Stop serving and close the socket (waits for the serving thread briefly)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class _WorkerGauges(Collector):
    """The gauges read from the worker at scrape time: state, tasks in flight, slots, heartbeat age."""

    def __init__(self, observer: PrometheusObserver) -> None:
        self._observer = observer

    def collect(self) -> Iterator[Metric]:
        observer = self._observer
        worker = observer.worker
        route = observer.route_labels
        names = list(route)
        values = list(route.values())
        state = GaugeMetricFamily("pgflow_worker_state", "1 for the worker's current state, 0 for the others "
                                  "(paused: stopped or stopping after a fatal claim paused its function)",
                                  labels=[*names, "state"])
        current = observer.state()
        for name in STATES:
            state.add_metric([*values, name], 1.0 if name == current else 0.0)
        yield state
        in_flight = GaugeMetricFamily("pgflow_worker_tasks_in_flight", "Claimed tasks whose handler has not "
                                      "finished (waiting for a slot or running)", labels=names)
        slots = GaugeMetricFamily("pgflow_worker_slots", "Handler slots (tasks that may run at once: "
                                  "WorkerOptions.max_concurrent, --concurrency)", labels=names)
        age = GaugeMetricFamily("pgflow_worker_heartbeat_age_seconds", "Seconds since the database last "
                                "recorded this worker's heartbeat (absent before the first one)", labels=names)
        if worker is not None:
            in_flight.add_metric(values, float(worker.tasks_in_flight()))
            slots.add_metric(values, float(worker.options.max_concurrent))
        last = observer.last_heartbeat
        if last is not None:
            age.add_metric(values, time.monotonic() - last)
        yield from (in_flight, slots, age)


class PrometheusObserver(Observer):
    """The metrics of one worker in their own registry, served by :class:`MetricsServer`.

    Args:
        flow_slug: the worker's flow.
        step_slug: the step it serves (step-queued flows), or ``None`` for the whole flow.
        queue_name: the queue it polls.
        host / port: where to serve (port 0: any free port).
        health_window: seconds; ``/healthz`` answers 503 when the poll loop has not completed a
            round (a read, or a wait for a free slot) for longer.

    Raises:
        OSError: the address cannot be bound.
    """

    def __init__(self, *, flow_slug: str, step_slug: str | None, queue_name: str, host: str, port: int,
                 health_window: float) -> None:
        self.worker: Any = None
        self.last_heartbeat: float | None = None
        self.last_round: float | None = None
        self.health_window = health_window
        self.route_labels = {"flow": flow_slug, "step": step_slug or "", "queue": queue_name}
        self.registry = CollectorRegistry(auto_describe=True)
        task = ["flow", "step", "queue"]
        self._claimed = Counter("pgflow_worker_tasks_claimed", "Tasks claimed (attempts started) by this worker",
                                task, registry=self.registry)
        self._completed = Counter("pgflow_worker_tasks_completed", "Attempts the database recorded as completed",
                                  task, registry=self.registry)
        self._failed = Counter("pgflow_worker_tasks_failed", "Attempts the database recorded as failed; outcome="
                               "retry: the task is queued again, final: the failure ends the task",
                               [*task, "outcome"], registry=self.registry)
        self._retry_later = Counter("pgflow_worker_tasks_retry_later", "Failed attempts whose handler asked for "
                                    "a retry delay (RetryLater) and that the database retries; also counted in "
                                    "tasks_failed{outcome=retry}",
                                    task, registry=self.registry)
        self._duration = Histogram("pgflow_worker_handler_duration_seconds", "How long handlers ran, whatever "
                                   "their outcome", task, buckets=DURATION_BUCKETS, registry=self.registry)
        route = list(self.route_labels)
        self._polls = Counter("pgflow_worker_polls", "Reads of the worker's queue", route, registry=self.registry)
        self._empty_polls = Counter("pgflow_worker_empty_polls", "Reads of the worker's queue that returned no "
                                    "message", route, registry=self.registry)
        self._batch = Histogram("pgflow_worker_report_batch_size", "Completions or failures sent in one report "
                                "call (kind=complete or fail)", [*route, "kind"], buckets=BATCH_BUCKETS,
                                registry=self.registry)
        self._db_errors = Counter("pgflow_worker_database_errors", "Database calls that raised, by operation "
                                  "(poll, report, heartbeat) and SQLSTATE class (none: no SQLSTATE, e.g. the "
                                  "connection was lost)", [*route, "operation", "sqlstate_class"],
                                  registry=self.registry)
        self._route = tuple(self.route_labels.values())
        self._children: dict[tuple[Any, ...], Any] = {}
        self._polls_child = self._polls.labels(*self._route)
        self._empty_child = self._empty_polls.labels(*self._route)
        self.registry.register(_WorkerGauges(self))
        self.server = MetricsServer(self.registry, self.health, host=host, port=port)

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` the metrics server listens on."""
        return self.server.address

    # the worker's state ---------------------------------------------------------------
    def state(self) -> str:
        """The worker's state as ``pgflow_worker_state`` names it."""
        worker = self.worker
        if worker is None:
            return "starting"
        if worker.paused:
            return "paused"
        state = str(worker.state)
        return state if state in STATES else "starting"

    def health(self) -> tuple[bool, str]:
        """Healthy while the worker runs and its poll loop completed a round within ``health_window``."""
        state = self.state()
        if state != "running":
            return False, f"not polling: the worker is {state}"
        last = self.last_round
        if last is None:
            return False, "not polling yet"
        age = time.monotonic() - last
        if age > self.health_window:
            return False, f"not polling: the poll loop's last round ended {age:.0f}s ago (window {self.health_window:g}s)"
        return True, "polling"

    # events ------------------------------------------------------------------------------
    def start(self, worker: Any) -> None:
        self.worker = worker

    def close(self) -> None:
        self.server.close()

    def polled(self, messages: int) -> None:
        self.last_round = time.monotonic()
        self._polls_child.inc()
        if not messages:
            self._empty_child.inc()

    def round(self) -> None:
        """The poll loop waited for a free slot instead of reading: it is alive all the same."""
        self.last_round = time.monotonic()

    def _child(self, metric: Any, step: str, *more: str) -> Any:
        """The series of ``metric`` for ``step`` (and ``more`` labels), looked up once: a worker has a
        handful of steps, and ``labels()`` takes a lock and builds a key on every call."""
        key = (id(metric), step, *more)
        child = self._children.get(key)
        if child is None:
            child = self._children.setdefault(key, metric.labels(self._route[0], step, self._route[2], *more))
        return child

    def claimed(self, step: str) -> None:
        self._child(self._claimed, step).inc()

    def handler_finished(self, step: str, seconds: float) -> None:
        self._child(self._duration, step).observe(seconds)

    def reported(self, step: str, ok: bool, failure: Any = None) -> None:
        if ok:
            self._child(self._completed, step).inc()
            return
        final = bool(getattr(failure, "final", False))
        self._child(self._failed, step, "final" if final else "retry").inc()
        if not final and getattr(failure, "retry", None) is not None:
            self._child(self._retry_later, step).inc()

    def report_batch(self, ok: bool, size: int) -> None:
        self._child(self._batch, self._route[1], "complete" if ok else "fail").observe(size)

    def database_error(self, operation: str, exc: BaseException) -> None:
        self._db_errors.labels(*self._route, operation, sqlstate_class(exc)).inc()

    def heartbeat(self) -> None:
        self.last_heartbeat = time.monotonic()

"""Typed ways to build a worker: one for plain flows, one for a step of a step-queued flow.

``Worker(flow, ..., step_slug=...)`` checks the combination at run time (before any database
access); these two functions let a type checker check it as well (spec "Type-quality
requirements"):

* :func:`flow_worker` takes only a plain :class:`~pgflow_cli.worker.flow.Flow` and no step;
* :func:`step_worker` takes only a :class:`~pgflow_cli.worker.flow.StepQueuedFlow` and requires
  one of its step slugs, typed as that flow's step-slug union, so ``step_worker(flow, "tpyo")``
  is a type error when the flow was declared ``Flow[Literal[...]]``.

Example::

    scrape = Flow[Literal["fetch", "parse"]]("scrape").step("fetch", fetch).step("parse", parse, depends_on=["fetch"])
    queued = with_step_queues(scrape)
    step_worker(queued, "parse", dsn, function_name="scrape-parse", options=WorkerOptions(max_concurrent=32)).run()
"""

from __future__ import annotations

from typing import Any

from pgflow_cli.worker.flow import Flow, StepQueuedFlow, StepSlug
from pgflow_cli.worker.options import WorkerOptions
from pgflow_cli.worker.runner import Worker


def flow_worker(flow: Flow[Any], conninfo: str, *, function_name: str, options: WorkerOptions | None = None,
                worker_id: str | None = None) -> Worker:
    """A whole-flow worker polling the plain flow's default queue ``lower(flow.slug)``.

    Args:
        flow: a plain flow (not step-queued).
        conninfo: libpq connection string.
        function_name: the worker function (``worker_functions`` key; the fence acts on it).
        options: how it runs (:class:`~pgflow_cli.worker.options.WorkerOptions`).
        worker_id: UUID of its worker row (random by default).

    Raises:
        DefinitionError: ``flow`` is step-queued, before any database access.
    """
    return Worker(flow, conninfo, function_name=function_name, options=options, worker_id=worker_id)


def step_worker(flow: StepQueuedFlow[StepSlug], step: StepSlug, conninfo: str, *, function_name: str,
                options: WorkerOptions | None = None, worker_id: str | None = None) -> Worker:
    """A step worker polling exactly one step's private queue and claiming only that step's tasks.

    Args:
        flow: a flow made by :func:`~pgflow_cli.worker.flow.with_step_queues`.
        step: one of its step slugs.
        conninfo: libpq connection string.
        function_name: the worker function (``worker_functions`` key; the fence acts on it).
        options: how it runs (:class:`~pgflow_cli.worker.options.WorkerOptions`).
        worker_id: UUID of its worker row (random by default).

    Raises:
        DefinitionError: ``flow`` is plain, or has no step ``step``, before any database access.
    """
    return Worker(flow, conninfo, function_name=function_name, step_slug=step, options=options, worker_id=worker_id)

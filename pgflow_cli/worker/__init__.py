"""Reference Python worker for pgflow: flow definitions and a worker that runs them.

Example::

    from pgflow_cli.worker import Flow, Worker

    flow = (
        Flow("greetUser")
        .step("fullName", lambda run_input, ctx: f"{run_input['first']} {run_input['last']}")
        .step("greeting", lambda deps, ctx: f"Hello, {deps['fullName']}!", depends_on=["fullName"])
    )
    Worker(flow, "host=/run/postgresql dbname=app", function_name="greet-user-worker").run()

A flow with one private queue per step (a slow step cannot starve a fast one)::

    from pgflow_cli.worker import with_step_queues, step_worker

    queued = with_step_queues(flow)          # same steps; routes checked before any database access
    step_worker(queued, "greeting", dsn, function_name="greet-user-greeting").run()

Handlers are ``def`` or ``async def`` functions ``(input, ctx)``; ``ctx`` is a :class:`TaskContext`
(attempt, last attempt, run input, deadline, stop signal), and a handler may raise
:class:`RetryLater` or :class:`FailNow` (docs/handlers.md).

It speaks the same database protocol as any other pgflow worker (register, heartbeat,
poll, claim, complete or fail) and is used by the tests, the benchmarks and the sandbox demo.
Importing it imports neither the command line (typer) nor its rendering (rich, tabulate).
"""

from pgflow_cli.worker.context import STOP_DRAINING, StopSignal, TaskContext
from pgflow_cli.worker.control import MAX_RETRY_DELAY, FailNow, RetryLater
from pgflow_cli.worker.errors import DefinitionError, InvalidRetryDelay, MetricsUnavailable, WorkerError
from pgflow_cli.worker.factories import flow_worker, step_worker
from pgflow_cli.worker.flow import Flow, StepDefinition, StepQueuedFlow, with_step_queues
from pgflow_cli.worker.options import WorkerOptions
from pgflow_cli.worker.protocol import (
    ClaimedTask,
    ClaimOutcome,
    FlowShapeMismatch,
    ProtocolMismatch,
    ProtocolV1,
    ProtocolV2,
    WorkerFenced,
    WorkerStartupError,
)
from pgflow_cli.worker.runner import Worker, WorkerStats

__all__ = [
    "MAX_RETRY_DELAY",
    "STOP_DRAINING",
    "ClaimOutcome",
    "ClaimedTask",
    "DefinitionError",
    "FailNow",
    "Flow",
    "FlowShapeMismatch",
    "InvalidRetryDelay",
    "MetricsUnavailable",
    "ProtocolMismatch",
    "ProtocolV1",
    "ProtocolV2",
    "RetryLater",
    "StepDefinition",
    "StepQueuedFlow",
    "StopSignal",
    "TaskContext",
    "Worker",
    "WorkerError",
    "WorkerFenced",
    "WorkerOptions",
    "WorkerStartupError",
    "WorkerStats",
    "flow_worker",
    "step_worker",
    "with_step_queues",
]

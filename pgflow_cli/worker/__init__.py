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

It speaks the same database protocol as any other pgflow worker (register, heartbeat,
poll, claim, complete or fail) and is used by the tests, the benchmarks and the sandbox demo.
"""

from pgflow_cli.worker.factories import flow_worker, step_worker
from pgflow_cli.worker.flow import Flow, StepDefinition, StepQueuedFlow, TaskContext, with_step_queues
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
    "ClaimOutcome",
    "ClaimedTask",
    "Flow",
    "FlowShapeMismatch",
    "ProtocolMismatch",
    "ProtocolV1",
    "ProtocolV2",
    "StepDefinition",
    "StepQueuedFlow",
    "TaskContext",
    "Worker",
    "WorkerFenced",
    "WorkerStartupError",
    "WorkerStats",
    "flow_worker",
    "step_worker",
    "with_step_queues",
]

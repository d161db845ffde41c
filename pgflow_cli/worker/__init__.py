"""Reference Python worker for pgflow: flow definitions and a worker that runs them.

Example::

    from pgflow_cli.worker import Flow, Worker

    flow = (
        Flow("greetUser")
        .step("fullName", lambda run_input, ctx: f"{run_input['first']} {run_input['last']}")
        .step("greeting", lambda deps, ctx: f"Hello, {deps['fullName']}!", depends_on=["fullName"])
    )
    Worker(flow, "host=/run/postgresql dbname=app", function_name="greet-user-worker").run()

It speaks the same database protocol as any other pgflow worker (register, heartbeat,
poll, claim, complete or fail) and is used by the tests, the benchmarks and the sandbox demo.
"""

from pgflow_cli.worker.flow import Flow, StepDefinition, TaskContext
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
    "TaskContext",
    "Worker",
    "WorkerFenced",
    "WorkerStartupError",
    "WorkerStats",
]

"""Start pgflow runs, read them and await their end, from Python (sync and asyncio).

Importing this package needs psycopg only: not the command line's typer, rich or tabulate.

A run is started through pgflow's own functions (``start_flow``, ``start_flows``), alone or inside
your transaction; awaiting reads the run's row with a bounded backoff, every awaited run of a client
in one statement per look, and reconnects after a lost connection (docs/client.md)::

    from pgflow_cli.client import Client, RunFailed

    with Client("postgresql://app@db/app") as client:
        run = client.start(greet, {"first": "Ada", "last": "Lovelace"})   # greet: a pgflow_cli.worker.Flow
        try:
            output = client.wait(run, timeout=60)
        except RunFailed as failed:
            for step in failed.failures:
                print(step.describe())

Inside your own transaction (the run starts if and only if your rows commit)::

    with conn.transaction():
        conn.execute("INSERT INTO documents ...")
        run = start_run(conn, greet, {"first": "Ada", "last": "Lovelace"})

Errors are :class:`pgflow_cli.errors.PgflowError` subclasses carrying the command line's exit codes:
:class:`RunFailed` (1), :class:`~pgflow_cli.jsoncheck.JsonValueError` and :class:`InvalidInput` (2),
``ConnectionFailed`` (3), :class:`WaitTimeout` (5), :class:`FlowNotFound`, :class:`RunNotFound` and
:class:`RunStateConflict` (6).

An operator role also cancels, retries and resumes runs (``client.cancel(run, reason)``,
``client.retry(run)``, ``client.resume(run)``; docs/client.md "Cancelling and restarting runs").
"""

from pgflow_cli.client.aio import (
    AsyncClient,
    cancel_run_async,
    get_run_async,
    resume_run_async,
    retry_run_async,
    start_run_async,
    start_runs_async,
)
from pgflow_cli.client.core import (
    MAX_CANCEL_REASON,
    FlowNotFound,
    InvalidInput,
    PollPolicy,
    RawJson,
    Run,
    RunFailed,
    RunNotFound,
    RunOutcome,
    RunProgress,
    RunState,
    RunStateConflict,
    StepFailure,
    StepState,
    TaskFailure,
    WaitStats,
    WaitTimeout,
)
from pgflow_cli.client.sync import Client, cancel_run, get_run, resume_run, retry_run, start_run, start_runs
from pgflow_cli.jsoncheck import JsonValueError

__all__ = [
    "MAX_CANCEL_REASON",
    "AsyncClient",
    "Client",
    "FlowNotFound",
    "InvalidInput",
    "JsonValueError",
    "PollPolicy",
    "RawJson",
    "Run",
    "RunFailed",
    "RunNotFound",
    "RunOutcome",
    "RunProgress",
    "RunState",
    "RunStateConflict",
    "StepFailure",
    "StepState",
    "TaskFailure",
    "WaitStats",
    "WaitTimeout",
    "cancel_run",
    "cancel_run_async",
    "get_run",
    "get_run_async",
    "resume_run",
    "resume_run_async",
    "retry_run",
    "retry_run_async",
    "start_run",
    "start_run_async",
    "start_runs",
    "start_runs_async",
]

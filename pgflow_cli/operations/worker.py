"""``pgflow worker``: load a flow from the user's Python module and run the reference worker.

Spec "Stage 2", "Worker coverage": one worker process polls one queue; a plain flow's worker
serves the whole flow on ``lower(flow_slug)``, a step worker serves exactly one step of a
step-queued flow on that step's private queue. Everything that can be checked without the
database (the module, the flow object, the step, the complete route map) is checked before a
connection is opened; a flow or step the worker cannot serve raises
:class:`~pgflow_cli.worker.DefinitionError` (exit 2), and the startup refusals of the database
(fence ``PF001``, protocol ``PF002``, shape or routing mismatch) surface as
:class:`~pgflow_cli.worker.WorkerStartupError` (exit 6).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from pgflow_cli import __version__, sqlfiles
from pgflow_cli.errors import UsageError
from pgflow_cli.worker import Flow, StepQueuedFlow, Worker, WorkerOptions, logs
from pgflow_cli.worker.flow import FlowDefinition

__all__ = ["DEFAULT_WORKER_VERSION", "WorkerOptions", "WorkerPlan", "build_worker", "configure_logging",
           "default_function_name", "import_module", "load_flow", "plan_worker", "split_target"]

DEFAULT_WORKER_VERSION = f"pgflow-cli {__version__}"
"""What a worker reports at registration unless ``--worker-version`` / ``$PGFLOW_WORKER_VERSION`` says otherwise."""


@dataclass(frozen=True)
class WorkerPlan:
    """Everything ``pgflow worker`` decided before touching the database.

    Attributes:
        flow: the loaded definition (plain or step-queued).
        step_slug: the step a step worker serves; ``None`` for a whole-flow worker.
        queue_name: the one queue the worker polls.
        function_name: the ``worker_functions`` row it registers under (the fence acts on it).
        source: ``MODULE:FLOW`` as given.
    """

    flow: FlowDefinition
    step_slug: str | None
    queue_name: str
    function_name: str
    source: str

    @property
    def queue_mode(self) -> str:
        """``flow`` or ``step``."""
        return self.flow.queue_mode


def split_target(text: str) -> tuple[str, str]:
    """Split ``MODULE:FLOW`` at its last colon.

    Args:
        text: ``package.module:attribute`` or ``path/to/file.py:attribute``.

    Returns:
        ``(module, attribute)``.

    Raises:
        UsageError: no colon, or an empty side (exit 2).
    """
    module, sep, attribute = text.rpartition(":")
    if not sep or not module or not attribute:
        raise UsageError(
            f"expected MODULE:FLOW, got {text!r}",
            hint="e.g. `pgflow worker myapp.flows:scrape` or `pgflow worker ./flows.py:scrape`",
        )
    return module, attribute


def _is_path(module: str) -> bool:
    return module.endswith(".py") or os.sep in module or "/" in module


def import_module(module: str) -> Any:
    """Import the user's module from a dotted name (current directory on the path) or a file.

    Raises:
        UsageError: the module or file cannot be found, or importing it raised (exit 2).
    """
    if _is_path(module):
        path = Path(module).expanduser().resolve()
        if not path.is_file():
            raise UsageError(f"no such file: {module}", hint="give a Python file path or an importable module name")
        name = f"pgflow_user_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise UsageError(f"{module} is not a Python module")
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))  # so the file can import its siblings
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[name] = loaded
        try:
            spec.loader.exec_module(loaded)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise _import_failed(module, exc) from exc
        return loaded
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules next to the caller are found
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            raise UsageError(f"cannot import module {module!r}: {exc}",
                             hint="run from the project directory, set PYTHONPATH, or give a file path") from None
        raise _import_failed(module, exc) from exc
    except Exception as exc:
        raise _import_failed(module, exc) from exc


def _import_failed(module: str, exc: BaseException) -> UsageError:
    return UsageError(
        f"importing {module} failed: {type(exc).__name__}: {exc}",
        hint=f"the error is in your module; `python -c 'import {module}'` or --debug shows the traceback"
        if not _is_path(module) else "the error is in your module; rerun with --debug for the traceback",
    )


def load_flow(target: str) -> FlowDefinition:
    """Load the flow object named by ``MODULE:FLOW``.

    Returns:
        A :class:`~pgflow_cli.worker.Flow` or :class:`~pgflow_cli.worker.StepQueuedFlow`.

    Raises:
        UsageError: unknown module or attribute, or an attribute that is not a flow; the
            message lists the flows the module does define (exit 2).
    """
    module_name, attribute = split_target(target)
    module = import_module(module_name)
    flows = sorted(name for name, value in vars(module).items()
                   if isinstance(value, (Flow, StepQueuedFlow)) and not name.startswith("_"))
    if not hasattr(module, attribute):
        raise UsageError(f"module {module_name} has no attribute {attribute!r}",
                         hint=("flows it defines: " + ", ".join(flows)) if flows else "it defines no Flow objects")
    value = getattr(module, attribute)
    if not isinstance(value, (Flow, StepQueuedFlow)):
        raise UsageError(f"{target} is a {type(value).__name__}, not a Flow or a with_step_queues() flow",
                         hint=("flows it defines: " + ", ".join(flows)) if flows else "")
    return value


def default_function_name(flow: FlowDefinition, step_slug: str | None) -> str:
    """``<flow>-worker`` for a whole-flow worker, ``<flow>-<step>-worker`` for a step worker.

    Each step of a step-queued flow gets its own function by default, so each step's pool is
    fenced, paused and counted on its own (docs/step-queues.md).
    """
    return f"{flow.slug}-{step_slug}-worker" if step_slug else f"{flow.slug}-worker"


def plan_worker(target: str, *, step_slug: str | None, function_name: str | None) -> WorkerPlan:
    """Load the flow and check the worker/step combination, all before any database access.

    Raises:
        UsageError: see :func:`load_flow` (exit 2).
        DefinitionError: a ``--step`` on a plain flow, none on a step-queued flow, or a step the
            flow does not have (exit 2).
    """
    from pgflow_cli.worker.protocol import LATEST

    flow = load_flow(target)
    queue = LATEST().queue_for(flow, step_slug)
    return WorkerPlan(flow=flow, step_slug=step_slug, queue_name=queue,
                      function_name=function_name or default_function_name(flow, step_slug), source=target)


def build_worker(plan: WorkerPlan, conninfo: str, options: WorkerOptions) -> Worker:
    """The reference worker for a plan.

    Args:
        plan: from :func:`plan_worker`.
        conninfo: libpq connection string.
        options: how it runs (concurrency, heartbeats, drain, tracebacks, ...).
    """
    return Worker(plan.flow, conninfo, function_name=plan.function_name, step_slug=plan.step_slug, options=options)


DEVELOP_QUERIES = "queries/develop.sql"


@dataclass(frozen=True)
class Recompile:
    """What starting a worker will delete: its flow changed and the database is in local mode.

    Attributes:
        flow_slug: the flow.
        runs / runs_in_flight: its runs, and those still started, counted before anything ran.
        tasks / tasks_in_flight: its tasks, and those queued or started.
        differences: the database's differences between the stored and the new definition.
    """

    flow_slug: str
    runs: int
    runs_in_flight: int
    tasks: int
    tasks_in_flight: int
    differences: list[str] = field(default_factory=list)

    def warning(self) -> str:
        """The loud line said before the worker starts."""
        return (f"LOCAL MODE (pgflow.environment=local): flow {self.flow_slug!r} changed. Starting this worker "
                f"DELETES its {self.runs} run(s) ({self.runs_in_flight} in flight) and {self.tasks} task(s) "
                f"({self.tasks_in_flight} queued or running), with its queues and their messages, and compiles "
                "the new definition in its place.")


def local_recompile(conn: psycopg.Connection, plan: WorkerPlan) -> Recompile | None:
    """Whether the worker's startup compilation will delete and recompile its flow, and what that deletes.

    Only in local mode (``pgflow.is_local()``, which the sandbox turns on): there a changed flow is
    deleted with its runs and compiled again. The rows are counted first; then the database's own
    compilation runs in a transaction that is rolled back, so the verdict is the one the worker will
    get (nothing is changed here).

    Args:
        conn: an autocommit connection to the worker's database.
        plan: the worker's plan (:func:`plan_worker`).

    Returns:
        A :class:`Recompile` when the worker will delete its flow's data, else None (production, a new
        flow, the same definition).

    Raises:
        psycopg.Error: from the server; FlowShapeMismatch cannot occur (local mode recompiles).
    """
    from pgflow_cli.worker.protocol import LATEST

    protocol = LATEST()
    if protocol.database_version(conn) != protocol.version:
        return None  # the worker refuses to start (its own check says why)
    if not conn.execute(sqlfiles.statement(DEVELOP_QUERIES, "is_local")).fetchone()[0]:  # type: ignore[index]
        return None
    row = conn.execute(sqlfiles.statement(DEVELOP_QUERIES, "flow_contents"), {"flow_slug": plan.flow.slug}).fetchone()
    runs, runs_in_flight, tasks, tasks_in_flight = (int(value) for value in row or (0, 0, 0, 0))
    with conn.transaction(force_rollback=True):  # a preview: the worker compiles for real
        verdict = protocol.compile_flow(conn, plan.flow, plan.step_slug)
    if verdict.get("status") != "recompiled":
        return None
    differences = verdict.get("differences")
    return Recompile(plan.flow.slug, runs, runs_in_flight, tasks, tasks_in_flight,
                     [str(d) for d in differences] if isinstance(differences, list) else [])


def configure_logging(level: str, log_format: str) -> None:
    """Log to stderr at ``level`` (``debug`` ... ``error``) as ``text`` or ``json`` lines
    (:func:`pgflow_cli.worker.logs.configure`)."""
    logs.configure(level, log_format)

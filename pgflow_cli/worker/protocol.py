"""The database protocol a worker speaks: startup compile, registration, read, claim, report.

Each protocol version is one class whose SQL lives in ``sql/queries/worker_v<N>.sql``.
A worker speaks exactly one version and checks ``pgflow.protocol_version()`` before it
compiles, registers or polls; any mismatch is refused with both versions and the fix
(DESIGN.md "The database has a protocol version").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgflow_cli import naming, sqlfiles
from pgflow_cli.errors import StateConflict
from pgflow_cli.worker.errors import DefinitionError, WorkerError
from pgflow_cli.worker.failures import TaskFailure

# SQLSTATEs raised by pgflow SQL (docs/architecture.md).
SQLSTATE_FENCED = "PF001"
SQLSTATE_PROTOCOL = "PF002"
SQLSTATE_DEFINITION = "PF003"
SQLSTATE_QUEUE_COLLISION = "PF004"
SQLSTATE_NOT_REGISTERED = "PF007"

PACKAGE_FOR_PROTOCOL = {
    1: "a pgflow-cli release before the queue-identity upgrade (database schema 0002)",
    2: "pgflow-cli with the queue-identity upgrade (database schema 0003 or later)",
}


class WorkerStartupError(WorkerError):
    """The worker refused to start; nothing was registered and nothing was polled."""

    exit_code = StateConflict.exit_code


class ProtocolMismatch(WorkerStartupError):
    """Worker and database speak different protocol versions."""


class WorkerFenced(WorkerStartupError):
    """The worker's function is fenced (``worker_functions.enabled = false``)."""


class FlowShapeMismatch(WorkerStartupError):
    """The database holds a different definition under this flow slug (production refuses)."""


def _fenced(function_name: str) -> WorkerFenced:
    return WorkerFenced(
        f"worker function {function_name!r} is disabled (worker_functions.enabled = false): not starting",
        hint="a rollout fence or a fatal claim disabled it: `pgflow fence status` shows an active fence (its reason, "
        "who, since when; `pgflow fence restore` lifts it, docs/rollout.md); otherwise see "
        "worker_functions.paused_reason and docs/claim-protocol.md",
    )


def _compile_verdict(row: Any, flow_slug: str) -> dict[str, Any]:
    """The database's startup-compilation verdict as a dict (any protocol).

    Raises:
        FlowShapeMismatch: the verdict is ``mismatch`` (``mismatchKind`` names shape or routing;
            protocol 1 reports no kind, which means shape).
    """
    result = row[0] if row else {}
    if isinstance(result, str):
        result = json.loads(result)
    if result.get("status") == "mismatch":
        kind = result.get("mismatchKind") or "shape"
        raise FlowShapeMismatch(
            f"flow {flow_slug!r} exists in the database with a different {kind}; this worker's definition was refused",
            hint="deploy the changed definition under a new, versioned flow slug (e.g. orders_v2 beside orders; "
            "docs/step-queues.md): production never recompiles a flow that may hold runs. On a development "
            "database, local mode recompiles it and deletes its runs: `pgflow sandbox up` runs in it, or "
            "ALTER DATABASE ... SET pgflow.environment = 'local'",
            detail=[str(d) for d in result.get("differences", [])],
        )
    return result


def protocol_mismatch(worker_version: int, database_version: int | None) -> ProtocolMismatch:
    """Build the refusal for a worker/database version mismatch (both directions)."""
    if database_version is None:
        return ProtocolMismatch(
            f"the database has no pgflow protocol version (worker speaks protocol {worker_version})",
            hint="install or upgrade the schema with `pgflow migrate apply`",
        )
    if database_version > worker_version:
        fix = (f"the database was upgraded to protocol {database_version}; deploy workers from "
               f"{PACKAGE_FOR_PROTOCOL.get(database_version, f'a release speaking protocol {database_version}')} "
               "(coordinated package-and-database upgrade)")
    else:
        fix = (f"the database still speaks protocol {database_version}; run `pgflow migrate apply` before deploying "
               "workers of this version (coordinated package-and-database upgrade)")
    return ProtocolMismatch(
        f"worker speaks pgflow protocol {worker_version}, database speaks protocol {database_version}: refusing to start",
        hint=fix,
    )


@dataclass(frozen=True)
class ClaimedTask:
    """A task this worker now owns (status started, attempt counted, visibility extended).

    ``flow_input`` is the run input for root single steps only (``None`` otherwise). ``attempt`` is
    the task's ``attempts_count`` after the claim (1 for its first attempt) when known; a claim does
    not read it (most handlers never ask): :meth:`ProtocolV1.claimed_attempts` does, for a batch.
    """

    flow_slug: str
    run_id: str
    step_slug: str
    input: Any
    message_id: int
    task_index: int
    flow_input: Any
    queue_name: str
    attempt: int | None = None


@dataclass(frozen=True)
class StepSettings:
    """A step's effective settings (the step's, else the flow's), read at startup.

    Attributes:
        timeout: seconds a task may run before its message becomes visible again.
        max_attempts: attempts in all, the first included.
        base_delay: seconds; the retry after attempt n waits ``floor(base_delay * 2**n)``.
    """

    timeout: int
    max_attempts: int
    base_delay: int


def _refused(cursor: psycopg.Cursor[Any]) -> int:
    """The number of refused reports a report statement returns (its one row's one column)."""
    row = cursor.fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def failure_report(task: ClaimedTask, failure: TaskFailure, *, directive: bool) -> dict[str, Any]:
    """The arguments of one failure report: ``fail_task``'s named parameters, and one element of
    ``fail_tasks``' JSON array. The one place they are built, for both calls.

    Args:
        directive: the database takes a handler's directive (``has_retry_control``): then the
            report has ``retry_delay_seconds`` (a ``RetryLater``'s delay from now, in seconds, else
            ``None``: the step's backoff) and ``fail_now`` (the handler raised ``FailNow``).
            Without it the report is ``fail_task``'s four released arguments.
    """
    report = {"run_id": task.run_id, "step_slug": task.step_slug, "task_index": task.task_index,
              "error_message": failure.message}
    if directive:
        report.update(retry_delay_seconds=failure.retry.delay() if failure.retry is not None else None,
                      fail_now=failure.fail_now)
    return report


@dataclass
class ClaimOutcome:
    """Result of one claim call on a batch of message ids.

    Attributes:
        claimed: tasks to run now.
        duplicates: message ids of tasks already started elsewhere (no attempt used).
        archived_terminal: message ids archived because their task already ended.
        archived_foreign: message ids archived as clearly foreign (not pgflow work).
        missing: message ids no longer in the queue (archived by someone else meanwhile).
        released: message ids of a fatal batch made visible again without being judged fatal.
        fatal_reason: set when the batch held unsupported work: nothing was claimed and
            the worker must stop (the database already paused its function).
        fatal_messages: message ids behind the fatal reason.
    """

    claimed: list[ClaimedTask] = field(default_factory=list)
    duplicates: list[int] = field(default_factory=list)
    archived_terminal: list[int] = field(default_factory=list)
    archived_foreign: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    fatal_reason: str | None = None
    fatal_messages: list[int] = field(default_factory=list)


class ProtocolV1:
    """Protocol 1: the released baseline. Queue = flow slug; claim = ``start_tasks``."""

    version = 1
    queries = "queries/worker_v1.sql"

    def _sql(self, name: str) -> str:
        return sqlfiles.statement(self.queries, name)

    def queue_name(self, flow_slug: str, step_slug: str | None) -> str:
        """The queue a worker for this flow polls."""
        if step_slug is not None:
            raise DefinitionError("protocol 1 has no private step queues; a step worker needs protocol 2 or later")
        return flow_slug

    def queue_for(self, flow: Any, step_slug: str | None) -> str:
        """The queue a worker of ``flow`` (a Flow or StepQueuedFlow) polls; checked before any database access.

        Raises:
            DefinitionError: a step-queued flow, which protocol 1 cannot serve.
        """
        if getattr(flow, "queue_mode", "flow") != "flow":
            raise DefinitionError(f"flow {flow.slug!r} uses private step queues, which protocol 1 does not have")
        return self.queue_name(flow.slug, step_slug)

    def compile_flow(self, conn: psycopg.Connection, flow: Any, step_slug: str | None) -> dict[str, Any]:
        """Startup compilation of a whole definition (see :meth:`compile`)."""
        return self.compile(conn, flow.slug, flow.shape(), step_slug)

    def database_version(self, conn: psycopg.Connection) -> int | None:
        """``pgflow.protocol_version()``, or ``None`` when the function does not exist."""
        row = conn.execute(sqlfiles.statement("queries/worker_v1.sql", "protocol_version")).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def check_version(self, conn: psycopg.Connection) -> None:
        """Raise :class:`ProtocolMismatch` unless the database speaks this version."""
        found = self.database_version(conn)
        if found != self.version:
            raise protocol_mismatch(self.version, found)

    def check_enabled(self, conn: psycopg.Connection, function_name: str) -> None:
        """Refuse a fenced function before anything is compiled (registration checks again, atomically).

        Raises:
            WorkerFenced: ``worker_functions.enabled`` is false for ``function_name``.
        """
        row = conn.execute(sqlfiles.statement(ProtocolV1.queries, "function_enabled"),
                           {"function_name": function_name}).fetchone()
        if row is not None and row[0] is False:
            raise _fenced(function_name)

    def compile(self, conn: psycopg.Connection, flow_slug: str, shape: dict[str, Any], step_slug: str | None) -> dict[str, Any]:
        """Startup compilation; returns the database's JSON verdict.

        Raises:
            FlowShapeMismatch: the stored definition differs (production).
        """
        row = conn.execute(self._sql("compile"), {"flow_slug": flow_slug, "shape": Jsonb(shape)}).fetchone()
        return _compile_verdict(row, flow_slug)

    def register(self, conn: psycopg.Connection, *, worker_id: str, function_name: str, queue_name: str,
                 flow_slug: str, step_slug: str | None, worker_version: str | None = None) -> None:
        """Insert the worker row (refused with PF001 when the function is fenced).

        ``worker_version`` is recorded by protocol 2 databases (``workers.worker_version``); the
        baseline schema has no such column and registers the worker without it.
        """
        params = {"worker_id": worker_id, "function_name": function_name, "queue_name": queue_name,
                  "flow_slug": flow_slug, "step_slug": step_slug, "worker_version": worker_version}
        query = self._sql("register")
        if worker_version is not None and self.version >= 2:
            query = sqlfiles.statement("queries/worker_v2.sql", "register_with_version")
        try:
            conn.execute(query, params)
        except psycopg.Error as exc:
            if getattr(exc, "sqlstate", None) == SQLSTATE_FENCED:
                raise _fenced(function_name) from None
            raise

    def heartbeat(self, conn: psycopg.Connection, worker_id: str, **route: Any) -> bool:
        """Record liveness; returns True when the worker has been deprecated (protocol 1 ignores ``route``)."""
        row = conn.execute(self._sql("heartbeat"), {"worker_id": worker_id}).fetchone()
        return bool(row and row[0])

    def read(self, conn: psycopg.Connection, *, queue_name: str, vt: int, qty: int,
             max_poll_seconds: int, poll_interval_ms: int) -> list[int]:
        """Read up to ``qty`` message ids (long poll); they stay invisible for ``vt`` seconds."""
        rows = conn.execute(self._sql("read"), {
            "queue_name": queue_name, "vt": vt, "qty": qty,
            "max_poll_seconds": max_poll_seconds, "poll_interval_ms": poll_interval_ms,
        }).fetchall()
        return [int(r[0]) for r in rows]

    def claim(self, conn: psycopg.Connection, *, flow_slug: str, step_slug: str | None, queue_name: str,
              message_ids: list[int], worker_id: str) -> ClaimOutcome:
        """Claim the tasks behind ``message_ids``; unclaimable ids are simply absent (protocol 1)."""
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(self._sql("claim"), {"flow_slug": flow_slug, "msg_ids": message_ids, "worker_id": worker_id}).fetchall()
        return ClaimOutcome(claimed=[
            ClaimedTask(
                flow_slug=r["flow_slug"], run_id=str(r["run_id"]), step_slug=r["step_slug"], input=r["input"],
                message_id=int(r["msg_id"]), task_index=int(r["task_index"]), flow_input=r["flow_input"],
                queue_name=queue_name,
            )
            for r in rows
        ])

    def claimed_attempts(self, conn: psycopg.Connection, *, flow_slug: str, queue_name: str, message_ids: list[int],
                         worker_id: str) -> dict[int, int]:
        """The attempt each task this worker claimed and still runs is in (``attempts_count``), by message id.

        Read on demand, once per claim batch, when a handler or a failure's log line first needs
        one (a claim does not read it: reading it with every claim cost more client CPU than the
        rest of a task's handling).

        Returns:
            ``{message_id: attempt}``; a task another claim has taken meanwhile is absent.
        """
        rows = conn.execute(self._attempts_sql(), {"flow_slug": flow_slug, "queue_name": queue_name,
                                                   "msg_ids": message_ids, "worker_id": worker_id}).fetchall()
        return {int(message_id): int(attempts) for message_id, attempts in rows}

    def _attempts_sql(self) -> str:
        return self._sql("claimed_attempts")

    def release(self, conn: psycopg.Connection, queue_name: str, message_ids: list[int]) -> None:
        """Make messages this worker read but will not claim visible again at once."""
        conn.execute(self._sql("release"), {"queue_name": queue_name, "msg_ids": message_ids})

    def complete(self, conn: psycopg.Connection, task: ClaimedTask, output: Any) -> int:
        """Report success with the task output.

        Returns:
            1 when the database refused the report because the task's run was cancelled (or failed)
            first, so nothing was recorded (it counts the refusal on the task); else 0.
        """
        return _refused(conn.execute(self._sql("complete"), {
            "run_id": task.run_id, "step_slug": task.step_slug, "task_index": task.task_index, "output": Jsonb(output),
        }))

    def fail(self, conn: psycopg.Connection, task: ClaimedTask, failure: TaskFailure) -> int:
        """Report a failed attempt (:func:`failure_report`); the database retries or exhausts the task.

        Returns:
            1 when the report was refused (as :meth:`complete`); else 0.
        """
        return _refused(conn.execute(self._sql("fail"), failure_report(task, failure, directive=False)))

    def has_retry_control(self, conn: psycopg.Connection) -> bool:
        """Whether the database's ``fail_task`` / ``fail_tasks`` take a handler's retry delay and
        fail-now (``RetryLater``, ``FailNow``). Protocol 1 databases never do: both are reported
        as ordinary failures."""
        return False

    def stopped(self, conn: psycopg.Connection, worker_id: str) -> None:
        """Mark the worker stopped."""
        conn.execute(self._sql("stopped"), {"worker_id": worker_id})

    def has_batch_reports(self, conn: psycopg.Connection) -> bool:
        """Whether the database has ``complete_tasks`` / ``fail_tasks`` (protocol 1 databases never do)."""
        return False

    def complete_many(self, conn: psycopg.Connection, results: list[tuple[ClaimedTask, Any]]) -> int:
        """Report several successes in one call (see :meth:`ProtocolV2.complete_many`).

        Raises:
            DefinitionError: protocol 1 has no batch entry point (check :meth:`has_batch_reports`).
        """
        raise DefinitionError("protocol 1 has no batch completion; report each task with complete()")

    def fail_many(self, conn: psycopg.Connection, failures: list[tuple[ClaimedTask, TaskFailure]]) -> int:
        """Report several failures in one call (see :meth:`ProtocolV2.fail_many`).

        Raises:
            DefinitionError: protocol 1 has no batch failure; report each task with fail().
        """
        raise DefinitionError("protocol 1 has no batch failure; report each task with fail()")

    def step_settings(self, conn: psycopg.Connection, flow_slug: str, step_slug: str | None) -> dict[str, StepSettings]:
        """Effective timeout, max_attempts and base_delay (the step's, else the flow's) of each step
        the worker may claim.

        Args:
            flow_slug: the compiled flow.
            step_slug: a step worker's step (only that step), or ``None`` for every step.

        Returns:
            ``{step_slug: StepSettings}``; empty when the flow is not compiled.
        """
        rows = conn.execute(sqlfiles.statement("queries/worker_v2.sql", "step_settings"),
                            {"flow_slug": flow_slug, "step_slug": step_slug}).fetchall()
        return {str(r[0]): StepSettings(timeout=int(r[1]), max_attempts=int(r[2]), base_delay=int(r[3])) for r in rows}

    def run_input(self, conn: psycopg.Connection, run_id: str) -> Any:
        """The input a run was started with (``None`` when the run is gone)."""
        row = conn.execute(sqlfiles.statement("queries/worker_v2.sql", "run_input"), {"run_id": run_id}).fetchone()
        return None if row is None else row[0]

    def ended_tasks(self, conn: psycopg.Connection, worker_id: str,
                    running: list[tuple[ClaimedTask, int | None]]) -> dict[int, tuple[str, bool]]:
        """Which of the tasks a worker runs are no longer wanted, in one query.

        Args:
            worker_id: the worker.
            running: ``(task, attempt)`` of every handler it runs (``None``: attempt not read).

        Returns:
            ``{position in running: (reason, taken_over)}``: the run or step is no longer started,
            or the task is no longer this attempt of this worker; ``taken_over`` when the worker
            must not report this attempt: another claim of the task runs, or stalled-task recovery
            queued it again in a run and step that go on (a report would end the next attempt).
        """
        rows = conn.execute(sqlfiles.statement("queries/worker_v2.sql", "ended_tasks"), {
            "worker_id": worker_id,
            "run_ids": [task.run_id for task, _ in running],
            "step_slugs": [task.step_slug for task, _ in running],
            "task_indexes": [task.task_index for task, _ in running],
            "attempts": [attempt for _, attempt in running],
        }).fetchall()
        ended = {int(r[0]) - 1: (str(r[1]), bool(r[2])) for r in rows}
        failed = {int(r[0]) - 1: str(running[int(r[0]) - 1][0].run_id) for r in rows
                  if r[3] == "failed" and not r[2]}
        if failed and _refused(conn.execute(sqlfiles.statement("queries/worker_v2.sql", "has_cancellations"))):
            # a failed run's cancel, if any, is kept beside the run (pgflow.run_cancellations)
            reasons = {str(run_id): reason for run_id, reason in conn.execute(
                sqlfiles.statement("queries/worker_v2.sql", "cancel_reasons"),
                {"run_ids": sorted(set(failed.values()))}).fetchall()}
            for position, run_id in failed.items():
                if run_id in reasons and ended[position][0] == "the run failed":
                    ended[position] = (f"the run was cancelled: {reasons[run_id]}", False)
        return ended


class ProtocolV2(ProtocolV1):
    """Protocol 2: queue identity. Queue = the flow's persisted route; claim = ``claim_tasks``.

    Registration, heartbeats, reads, complete and fail are unchanged from protocol 1.
    """

    version = 2
    v2_queries = "queries/worker_v2.sql"

    def heartbeat(self, conn: psycopg.Connection, worker_id: str, **route: Any) -> bool:
        """Record liveness for the route this worker registered; True when it has been deprecated.

        Args:
            route: ``function_name``, ``queue_name``, ``flow_slug``, ``step_slug`` of the worker,
                checked against the worker row: a heartbeat under an id registered for another
                route is refused (SQLSTATE PF007: the process is stale). Without them only the id
                is sent.

        Raises:
            psycopg.Error: PF007 when the id belongs to another route.
        """
        if not route:
            return super().heartbeat(conn, worker_id)
        row = conn.execute(sqlfiles.statement(self.v2_queries, "heartbeat"), {"worker_id": worker_id, **route}).fetchone()
        return bool(row and row[0])

    _retry_control: bool | None = None

    def has_retry_control(self, conn: psycopg.Connection) -> bool:
        """Whether the database has ``fail_task``'s six-argument form (retry delay, fail-now) and
        ``fail_tasks`` elements that take them (this build's schema 0003); asked once, then
        remembered. :meth:`fail` and :meth:`fail_many` send a handler's directive only where it is."""
        if self._retry_control is None:
            row = conn.execute(sqlfiles.statement(self.v2_queries, "has_retry_control")).fetchone()
            self._retry_control = bool(row and row[0])
        return self._retry_control

    def fail(self, conn: psycopg.Connection, task: ClaimedTask, failure: TaskFailure) -> int:
        """Report a failed attempt with the handler's directive where the database takes it
        (:meth:`has_retry_control`), else as protocol 1 does; returns 1 when it was refused (as
        :meth:`complete`), else 0."""
        if not self.has_retry_control(conn):
            return super().fail(conn, task, failure)
        return _refused(conn.execute(sqlfiles.statement(self.v2_queries, "fail_directed"),
                                     failure_report(task, failure, directive=True)))

    def has_batch_reports(self, conn: psycopg.Connection) -> bool:
        """Protocol 2 databases always have ``pgflow.complete_tasks(jsonb)`` and ``pgflow.fail_tasks(jsonb)``."""
        return True

    def complete_many(self, conn: psycopg.Connection, results: list[tuple[ClaimedTask, Any]]) -> int:
        """Report several successes in one ``pgflow.complete_tasks`` call (one transaction).

        Args:
            results: ``(task, output)`` pairs, applied in this order with the per-task semantics
                of ``complete_task``; every output must be JSON-serialisable.

        Returns:
            How many were refused because their run was cancelled (or failed) first.

        Raises:
            psycopg.Error: the call raised (an element it refused, a lost connection...); nothing
                of the batch was applied, so each task can be reported alone.
        """
        tasks = [{"run_id": task.run_id, "step_slug": task.step_slug, "task_index": task.task_index, "output": output}
                 for task, output in results]
        return _refused(conn.execute(sqlfiles.statement(self.v2_queries, "complete_many"), {"tasks": Jsonb(tasks)}))

    def fail_many(self, conn: psycopg.Connection, failures: list[tuple[ClaimedTask, TaskFailure]]) -> int:
        """Report several failures in one ``pgflow.fail_tasks`` call (one transaction); returns how
        many were refused (as :meth:`complete_many`).

        Args:
            failures: ``(task, failure)`` pairs, each sent as :func:`failure_report` builds it, applied in this order with the per-task
                semantics of ``fail_task`` (retry or exhaust).

        Raises:
            psycopg.Error: the call raised; nothing of the batch was applied.
        """
        directive = self.has_retry_control(conn)
        tasks = [failure_report(task, failure, directive=directive) for task, failure in failures]
        return _refused(conn.execute(sqlfiles.statement(self.v2_queries, "fail_many"), {"tasks": Jsonb(tasks)}))

    def queue_name(self, flow_slug: str, step_slug: str | None) -> str:
        """The generated lowercase default queue (plain flows; step workers need private step queues)."""
        if step_slug is not None:
            raise DefinitionError("a step's queue comes from its StepQueuedFlow; use queue_for(flow, step_slug)")
        queue = naming.default_queue_name(flow_slug)
        if queue.name is None:
            raise DefinitionError(f"flow slug {flow_slug!r} cannot be used: {naming.describe_reasons([queue.reason or ''])}")
        return queue.name

    def queue_for(self, flow: Any, step_slug: str | None) -> str:
        """The one queue a worker of ``flow`` polls (spec "Worker coverage"), before any database access.

        Args:
            flow: a :class:`~pgflow_cli.worker.flow.Flow` (whole-flow worker, ``step_slug`` None)
                or a :class:`~pgflow_cli.worker.flow.StepQueuedFlow` (step worker, ``step_slug``
                names one of its steps).
            step_slug: the step a step worker serves.

        Returns:
            ``lower(flow_slug)`` for a plain flow, else the step's generated private queue.

        Raises:
            DefinitionError: a step worker of a plain flow, a step-queued flow without a step, or
                a step the flow does not have (exit 2).
        """
        if getattr(flow, "queue_mode", "flow") == "step":
            if step_slug is None:
                raise DefinitionError(
                    f"flow {flow.slug!r} uses private step queues: each worker serves exactly one step",
                    hint="name the step (step_worker(flow, step) or `pgflow worker ... --step SLUG`); steps: "
                    + ", ".join(flow.routes),
                )
            return str(flow.queue_for(step_slug))
        if step_slug is not None:
            raise DefinitionError(
                f"flow {flow.slug!r} is a plain flow: its workers serve the whole flow, not step {step_slug!r}",
                hint="drop the step (--step), or deploy with_step_queues(flow) under a new concrete flow slug",
            )
        return self.queue_name(flow.slug, None)

    def compile_flow(self, conn: psycopg.Connection, flow: Any, step_slug: str | None) -> dict[str, Any]:
        """Startup compilation with the flow's queue mode and the route map this worker derived.

        SQL validates shape, mode and routes before any change and is authoritative.

        Raises:
            FlowShapeMismatch: the stored definition differs (production).
        """
        if getattr(flow, "queue_mode", "flow") == "step":
            return self._compile(conn, flow.slug, flow.shape(), "step", flow.route_map())
        return self.compile(conn, flow.slug, flow.shape(), step_slug)

    def compile(self, conn: psycopg.Connection, flow_slug: str, shape: dict[str, Any], step_slug: str | None) -> dict[str, Any]:
        """Protocol-2 startup compilation of a plain flow with the route map this worker derived (checked by SQL)."""
        queue = self.queue_name(flow_slug, None)
        # a manual step has no route (docs/manual-tasks.md); the database derives the same map
        route_map = [{"stepSlug": step["slug"], "queueName": None if step.get("executionMode") == "manual" else queue}
                     for step in shape["steps"]]
        return self._compile(conn, flow_slug, shape, "flow", route_map)

    def _compile(self, conn: psycopg.Connection, flow_slug: str, shape: dict[str, Any], queue_mode: str,
                 route_map: list[dict[str, str | None]]) -> dict[str, Any]:
        row = conn.execute(sqlfiles.statement(self.v2_queries, "compile"), {
            "flow_slug": flow_slug, "shape": Jsonb(shape), "queue_mode": queue_mode, "route_map": Jsonb(route_map),
        }).fetchone()
        return _compile_verdict(row, flow_slug)

    def claim(self, conn: psycopg.Connection, *, flow_slug: str, step_slug: str | None, queue_name: str,
              message_ids: list[int], worker_id: str) -> ClaimOutcome:
        """Classifying claim: returns every message's outcome (fatal outcomes already paused the function)."""
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(sqlfiles.statement(self.v2_queries, "claim"), {
                "queue_name": queue_name, "msg_ids": message_ids, "worker_id": worker_id,
                "flow_slug": flow_slug, "step_slug": step_slug,
            }).fetchall()
        outcome = ClaimOutcome()
        fatal_reasons: list[str] = []
        for r in rows:
            kind, message_id = r["outcome"], int(r["message_id"])
            if kind == "claimed":
                outcome.claimed.append(ClaimedTask(
                    flow_slug=r["flow_slug"], run_id=str(r["run_id"]), step_slug=r["step_slug"], input=r["input"],
                    message_id=message_id, task_index=int(r["task_index"]), flow_input=r["flow_input"],
                    queue_name=queue_name,
                ))
            elif kind == "duplicate":
                outcome.duplicates.append(message_id)
            elif kind == "archived_terminal":
                outcome.archived_terminal.append(message_id)
            elif kind == "archived_foreign":
                outcome.archived_foreign.append(message_id)
            elif kind == "missing":
                outcome.missing.append(message_id)
            elif kind == "fatal":
                outcome.fatal_messages.append(message_id)
                fatal_reasons.append(f"message {message_id}: {r['reason']}")
            elif kind == "released":
                outcome.released.append(message_id)
        if outcome.fatal_messages:
            outcome.fatal_reason = "; ".join(fatal_reasons)
        return outcome

    def _attempts_sql(self) -> str:
        return sqlfiles.statement(self.v2_queries, "claimed_attempts")


LATEST = ProtocolV2
"""The protocol new workers speak by default."""

PROTOCOLS = {1: ProtocolV1, 2: ProtocolV2}


def for_version(version: int) -> ProtocolV1:
    """The protocol class for ``version``.

    Raises:
        DefinitionError: unknown version.
    """
    try:
        return PROTOCOLS[version]()
    except KeyError:
        raise DefinitionError(f"unknown protocol version {version}; this worker speaks {sorted(PROTOCOLS)}") from None

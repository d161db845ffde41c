"""Manual tasks: list, show, complete and fail tasks of queue-less steps (docs/manual-tasks.md).

A manual step (``Flow.step(..., manual=True)``, ``execution_mode = 'manual'``) has no queue and
no worker. When it becomes ready the database creates its task rows (task_index 0 for a single
step, one per item for a map step), and trusted server code finishes each task through
``pgflow.complete_manual_task`` / ``pgflow.fail_manual_task``. This module is that code's Python
entry point and the ``pgflow task`` command's operations.

Every function takes an existing psycopg connection and runs on it as it is:

* inside the caller's transaction (``with conn.transaction(): ...``, or a non-autocommit
  connection with work pending), :func:`complete` and :func:`fail` run in a savepoint, so the
  application's own rows (an approval record) and the workflow's progression commit or roll back
  together, and a refused call (conflict, not active) leaves the caller's transaction usable;
* on an autocommit connection each call is its own transaction.

Nothing here commits a transaction it did not open. Task inputs and outputs are never read back
or printed (reports name tasks, they do not carry their data).

Errors (each a :class:`pgflow_cli.errors.StateConflict`, exit 6, with a stable ``code``):
:class:`ManualTaskNotFound` (SQLSTATE PF009), :class:`ManualTaskNotManual` (PF010),
:class:`ManualTaskNotActive` (PF011), :class:`ManualTaskConflict` (PF012). Bad arguments raise
:class:`pgflow_cli.errors.UsageError` (exit 2) before anything is sent.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgflow_cli import sqlfiles
from pgflow_cli.errors import StateConflict, UsageError
from pgflow_cli.operations import names

QUERIES = "queries/manual_tasks.sql"
"""The named statements, below ``sql/``."""

DOCUMENT_KIND = "pgflow-cli/manual-tasks"
DOCUMENT_VERSION = 1
"""JSON document identity of ``pgflow task`` output; bump the version on an incompatible change."""

MAX_ERROR_MESSAGE = 2000
"""Characters of an error message :func:`fail` accepts (the worker keeps the same length)."""


class ManualTaskError(StateConflict):
    """A manual-task call the database refused (exit 6). ``code`` and ``sqlstate`` are stable."""

    code = "manual_task_error"
    sqlstate = ""


class ManualTaskNotFound(ManualTaskError):
    """No run with that id, or no task at that step and index (yet: the step has not started)."""

    code = "manual_task_not_found"
    sqlstate = "PF009"


class ManualTaskNotManual(ManualTaskError):
    """The task is queue-backed (its worker reports it), or a worker reported a manual task."""

    code = "manual_task_not_manual"
    sqlstate = "PF010"


class ManualTaskNotActive(ManualTaskError):
    """The task, its step or its run is no longer started (skipped, cancelled, run finished)."""

    code = "manual_task_not_active"
    sqlstate = "PF011"


class ManualTaskConflict(ManualTaskError):
    """The task already holds another outcome, or the same outcome with another output or error."""

    code = "manual_task_conflict"
    sqlstate = "PF012"


ERRORS: dict[str, type[ManualTaskError]] = {
    cls.sqlstate: cls for cls in (ManualTaskNotFound, ManualTaskNotManual, ManualTaskNotActive, ManualTaskConflict)
}
"""Exception class of each manual-task SQLSTATE."""


@dataclass(frozen=True)
class ManualTask:
    """One task as ``pgflow task`` reports it (no input, no output).

    Attributes:
        run_id: the run (UUID text).
        flow_slug, step_slug, task_index: the rest of the task address (index 0 for a single step).
        status: task status (``started`` while waiting; ``completed``, ``failed``, ``skipped``,
            ``cancelled``).
        execution_mode: ``manual`` (or ``queue`` for a task :func:`show` found but cannot complete).
        step_type: ``single`` or ``map``.
        run_status, step_status: the run's and the step state's status.
        started_at, completed_at, failed_at: timestamps (timezone-aware).
        age_seconds: seconds since ``started_at`` (how long it has waited).
        error_message: the failure reason of a failed task.
    """

    run_id: str
    flow_slug: str
    step_slug: str
    task_index: int
    status: str
    execution_mode: str
    step_type: str
    run_status: str
    step_status: str
    started_at: _dt.datetime | None
    completed_at: _dt.datetime | None
    failed_at: _dt.datetime | None
    age_seconds: float | None
    error_message: str | None

    @property
    def waiting(self) -> bool:
        """True while trusted code can still complete or fail it."""
        return self.status == "started" and self.run_status == "started" and self.step_status == "started"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (timestamps ISO 8601 through :mod:`pgflow_cli.render`)."""
        return {**asdict(self), "waiting": self.waiting}


def _task(row: dict[str, Any]) -> ManualTask:
    return ManualTask(
        run_id=str(row["run_id"]), flow_slug=row["flow_slug"], step_slug=row["step_slug"],
        task_index=row["task_index"], status=row["status"], execution_mode=row["execution_mode"],
        step_type=row["step_type"], run_status=row["run_status"], step_status=row["step_status"],
        started_at=row["started_at"], completed_at=row["completed_at"], failed_at=row["failed_at"],
        age_seconds=row["age_seconds"], error_message=row["error_message"],
    )


def _address(run_id: str | uuid.UUID, step_slug: str, task_index: int) -> dict[str, Any]:
    try:
        run = str(uuid.UUID(str(run_id)))
    except ValueError:
        raise UsageError(f"run id {str(run_id)!r} is not a UUID", hint="copy it from `pgflow task list`") from None
    if not isinstance(step_slug, str) or not step_slug:
        raise UsageError("a step slug is required")
    if not isinstance(task_index, int) or isinstance(task_index, bool) or task_index < 0:
        raise UsageError(f"task index must be a whole number >= 0, got {task_index!r}")
    return {"run_id": run, "step_slug": step_slug, "task_index": task_index}


def translate(exc: psycopg.Error) -> Exception:
    """The :class:`ManualTaskError` for a manual-task SQLSTATE, else ``exc`` itself.

    Message and hint come from the database (they name the task address, never data).
    """
    cls = ERRORS.get(getattr(exc, "sqlstate", None) or "")
    if cls is None:
        return exc
    diag = exc.diag
    return cls((diag.message_primary or str(exc)).strip(), hint=diag.message_hint or "")


@contextmanager
def _refusals() -> Iterator[None]:
    try:
        yield
    except psycopg.Error as exc:
        translated = translate(exc)
        if translated is exc:
            raise
        raise translated from None


def list_waiting(
    conn: psycopg.Connection, *, flow_slug: str | None = None, older_than: float | None = None, limit: int = 100
) -> list[ManualTask]:
    """Waiting manual tasks (started, in a started step of a started run), oldest first.

    Args:
        conn: any psycopg connection (autocommit or inside a transaction).
        flow_slug: only this flow (exact slug); ``None`` for every flow.
        older_than: only tasks waiting longer than this many seconds (``None``: any age).
        limit: at most this many rows (1..10000).

    Returns:
        :class:`ManualTask` rows.

    Raises:
        UsageError: a negative ``older_than`` or a limit out of range.
    """
    if older_than is not None and (not math.isfinite(older_than) or older_than < 0):
        raise UsageError(f"older-than must be zero or more seconds, got {older_than!r}")
    if not isinstance(limit, int) or not 1 <= limit <= 10000:
        raise UsageError(f"limit must be between 1 and 10000, got {limit!r}")
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(sqlfiles.statement(QUERIES, "list_waiting"),
                           {"flow_slug": flow_slug, "older_than": older_than, "limit": limit}).fetchall()
    return [_task(row) for row in rows]


def show(conn: psycopg.Connection, run_id: str | uuid.UUID, step_slug: str, task_index: int = 0) -> ManualTask:
    """The task at ``(run_id, step_slug, task_index)``, whatever its state.

    Raises:
        UsageError: malformed address.
        ManualTaskNotFound: no such task.
        ManualTaskNotManual: the task is queue-backed.
    """
    address = _address(run_id, step_slug, task_index)
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(sqlfiles.statement(QUERIES, "show"), address).fetchone()
    label = f"run {address['run_id']}, step {step_slug!r}, task index {task_index}"
    if row is None:
        raise ManualTaskNotFound(f"no task at {label}{_step_suggestion(conn, address)}",
                                 hint="a manual task exists once its step is ready (`pgflow task list`)")
    if row["execution_mode"] != "manual":
        raise ManualTaskNotManual(f"the task at {label} is queue-backed, not manual",
                                  hint="its worker reports it; `pgflow task` handles manual tasks only")
    return _task(row)


def _step_suggestion(conn: psycopg.Connection, address: dict[str, Any]) -> str:
    """`` (did you mean 'approve'?)`` when the run exists and has a step close to the one given."""
    steps = names.run_step_slugs(conn, address["run_id"])
    return names.did_you_mean(address["step_slug"], steps) if address["step_slug"] not in steps else ""


def _record(conn: psycopg.Connection, statement: str, params: dict[str, Any]) -> ManualTask:
    try:
        with _refusals(), conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(sqlfiles.statement(QUERIES, statement), params)
            row = cur.execute(sqlfiles.statement(QUERIES, "show"),
                              {k: params[k] for k in ("run_id", "step_slug", "task_index")}).fetchone()
    except ManualTaskNotFound as exc:
        suggestion = _step_suggestion(conn, params)
        if suggestion:
            exc.message += suggestion
            exc.args = (exc.message,)
        raise
    assert row is not None  # the statement above just wrote this task
    return _task(row)


def complete(conn: psycopg.Connection, run_id: str | uuid.UUID, step_slug: str, task_index: int, output: Any) -> ManualTask:
    """Complete a manual task with ``output`` (``pgflow.complete_manual_task``), in a savepoint of
    the caller's transaction or a transaction of its own.

    Args:
        conn: psycopg connection; inside a transaction the completion joins it.
        run_id, step_slug, task_index: the task address (task_index 0 for a single step).
        output: JSON-serialisable task output (a single step that feeds a map step must give a list).

    Returns:
        The task afterwards. Repeating the same completion returns it unchanged (nothing
        progresses twice).

    Raises:
        UsageError: malformed address or an output that is not JSON.
        ManualTaskNotFound, ManualTaskNotManual, ManualTaskNotActive, ManualTaskConflict.
    """
    address = _address(run_id, step_slug, task_index)
    try:
        json.dumps(output, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"the output is not JSON: {exc}") from None
    return _record(conn, "complete", {**address, "output": Jsonb(output)})


def fail(conn: psycopg.Connection, run_id: str | uuid.UUID, step_slug: str, task_index: int, error_message: str) -> ManualTask:
    """Fail a manual task (``pgflow.fail_manual_task``): final, no retry; the step's
    when_exhausted decides what follows (fail the run, skip, skip-cascade).

    Args:
        conn, run_id, step_slug, task_index: as for :func:`complete`.
        error_message: why (1..2000 characters, no NUL); stored on the task and step.

    Returns:
        The task afterwards; repeating the same failure returns it unchanged.

    Raises:
        UsageError: malformed address or error message.
        ManualTaskNotFound, ManualTaskNotManual, ManualTaskNotActive, ManualTaskConflict.
    """
    address = _address(run_id, step_slug, task_index)
    if not isinstance(error_message, str) or not error_message.strip():
        raise UsageError("an error message is required")
    if len(error_message) > MAX_ERROR_MESSAGE or "\x00" in error_message:
        raise UsageError(f"the error message must be at most {MAX_ERROR_MESSAGE} characters without NUL")
    return _record(conn, "fail", {**address, "error_message": error_message})


def document(tasks: list[ManualTask]) -> dict[str, Any]:
    """The versioned JSON document of ``pgflow task list|show|complete|fail``."""
    return {"kind": DOCUMENT_KIND, "version": DOCUMENT_VERSION, "tasks": [t.to_dict() for t in tasks]}

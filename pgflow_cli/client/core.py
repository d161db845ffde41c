"""What the synchronous and the asyncio client share: results, errors, statements and the wait book.

Nothing here does I/O. :mod:`pgflow_cli.client.sync` and :mod:`pgflow_cli.client.aio` send the
statements this module prepares and hand the rows back to it, so both drivers start, read and await
runs with exactly the same rules.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Union

import psycopg
from psycopg import pq
from psycopg.types.json import Jsonb
from typing_extensions import TypeVar

from pgflow_cli import jsoncheck, sqlfiles
from pgflow_cli.db import first_line
from pgflow_cli.errors import ConnectionFailed, DeadlineReached, Refused, SchemaMissing, StateConflict, UsageError

if TYPE_CHECKING:
    from pgflow_cli.worker.flow import Flow, StepQueuedFlow

QUERIES = "queries/client.sql"
"""The client's named statements, below ``sql/``."""

S = TypeVar("S", bound=str, default=str)
"""The step slugs of the flow a run belongs to: a flow declared ``Flow[Literal["a", "b"]]`` gives
runs, outcomes and failures typed by those slugs; a run started by slug has plain ``str`` slugs."""

FlowRef = Union["Flow[S]", "StepQueuedFlow[S]", str]
"""A flow given as its object (:class:`pgflow_cli.worker.Flow` or a step-queued flow) or as its slug."""

RunRef = Union["Run[S]", "RunOutcome[S]", str, uuid.UUID]
"""A run given as what :meth:`~pgflow_cli.client.Client.start` returned, or as its id."""


# --------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------
class FlowNotFound(StateConflict):
    """No flow with that slug in the database (exit 6): no worker of it has started yet, or a typo."""


class RunNotFound(StateConflict):
    """No run with that id (exit 6): a typo, a run pruned or deleted, or one started in a transaction
    that has not committed (a waiter on another connection cannot see it)."""


class RunStateConflict(StateConflict):
    """The run is not in a state the operation takes (exit 6): only a started run can be cancelled,
    only a failed (or cancelled) one retried or resumed, and a resume refuses a flow compiled again
    since its source started. Nothing was changed."""


class InvalidInput(UsageError):
    """The database refused the run input for this flow (exit 2): a flow with a root map step needs a
    JSON array, and an input must not be SQL NULL."""


class RunFailed(Refused):
    """The awaited run ended ``failed`` (exit 1).

    Attributes:
        outcome: the whole outcome (run id, flow, times, failures).
        failures: the failed steps, each with its error and its failed tasks' errors.
    """

    def __init__(self, outcome: RunOutcome[Any]) -> None:
        lines = [failure.describe() for failure in outcome.failures] or ["(no failed step recorded)"]
        super().__init__(f"run {outcome.run_id} of flow {outcome.flow_slug} failed",
                         hint=f"pgflow runs show {outcome.run_id} shows every step and task", detail=lines)
        self.outcome = outcome
        self.failures = outcome.failures


class WaitTimeout(DeadlineReached):
    """The deadline came before the run ended (exit 5); the run goes on.

    Attributes:
        run_id: the run.
        progress: where it stood at the last look (``None`` if it was never read).
    """

    def __init__(self, run_id: str, timeout: float | None, progress: RunProgress | None) -> None:
        where = f": {progress.describe()}" if progress and progress.status else ""
        super().__init__(f"run {run_id} did not end within {timeout:g} s{where}" if timeout is not None
                         else f"run {run_id} did not end{where}",
                         hint=f"wait again with: pgflow runs wait {run_id}")
        self.run_id = run_id
        self.progress = progress


# --------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run(Generic[S]):
    """A run as it was right after it started (``start`` / ``start_many``).

    Attributes:
        run_id: its id (UUID text).
        flow_slug: its flow.
        status: ``started``, or already ``completed``/``failed`` when the flow settles at once (a
            flow whose steps are all skipped or empty maps).
        remaining_steps: steps not yet completed or skipped.
        started_at: when it started (timezone-aware).
        restart_of_run_id: the run it restarts (``retry`` / ``resume``), else None.
        cancel_reason: why it was cancelled (``cancel``), else None.
    """

    run_id: str
    flow_slug: str
    status: str
    remaining_steps: int
    started_at: dt.datetime
    restart_of_run_id: str | None = None
    cancel_reason: str | None = None


@dataclass(frozen=True)
class TaskFailure:
    """One failed task: its index (0 for a single step; the element of a map), its last error and how
    many attempts it used."""

    task_index: int
    error_message: str | None
    attempts_count: int


@dataclass(frozen=True)
class StepFailure(Generic[S]):
    """A failed step of a failed run: its error and its failed tasks (at most 20 of a map step).

    A step can fail without a failed task (a condition not met with ``when_unmet='fail'``, an output
    that cannot feed a map step); ``tasks`` is then empty and ``error_message`` says why.
    """

    step_slug: S
    error_message: str | None
    tasks: tuple[TaskFailure, ...] = ()

    def describe(self) -> str:
        """One line: ``step 'charge' (task 0, 3 attempts): ValueError: card declined``."""
        task = self.tasks[0] if self.tasks else None
        where = f" (task {task.task_index}, {task.attempts_count} attempt(s))" if task else ""
        more = f"; {len(self.tasks) - 1} more failed task(s)" if len(self.tasks) > 1 else ""
        message = (task.error_message if task and task.error_message else self.error_message) or "no error recorded"
        return f"step {self.step_slug!r}{where}: {message}{more}"


@dataclass(frozen=True)
class RunProgress:
    """Where an awaited run stood at the client's last look (``status`` is ``None`` before the first)."""

    run_id: str
    status: str | None = None
    remaining_steps: int | None = None
    looked_at: dt.datetime | None = None

    def describe(self) -> str:
        """``started, 2 step(s) remaining``."""
        if self.status is None:
            return "not read yet"
        return f"{self.status}, {self.remaining_steps} step(s) remaining"


@dataclass(frozen=True)
class RunOutcome(Generic[S]):
    """How an awaited run ended.

    Attributes:
        run_id, flow_slug: the run.
        status: ``completed`` or ``failed``.
        output: a completed run's output, ``{leaf_step: its output}`` for every leaf step that
            completed (skipped leaves are absent); ``None`` for a failed run.
        failures: a failed run's failed steps (empty for a completed run).
        remaining_steps: steps neither completed nor skipped (0 for a completed run).
        started_at, ended_at: timezone-aware times.
    """

    run_id: str
    flow_slug: str
    status: str
    output: dict[S, Any] | None
    failures: tuple[StepFailure[S], ...]
    remaining_steps: int
    started_at: dt.datetime
    ended_at: dt.datetime

    @property
    def ok(self) -> bool:
        """True for a completed run."""
        return self.status == "completed"

    def result(self) -> dict[S, Any]:
        """The output of a completed run.

        Raises:
            RunFailed: the run failed (its failures attached).
        """
        if not self.ok:
            raise RunFailed(self)
        return self.output or {}


@dataclass(frozen=True)
class StepState(Generic[S]):
    """One step of a run as :meth:`~pgflow_cli.client.Client.get` read it.

    ``output`` is set for a completed step (a map step's: the list of its tasks' outputs);
    ``skip_reason`` for a skipped one; ``error_message`` for a failed one.
    """

    step_slug: S
    status: str
    output: Any
    error_message: str | None
    skip_reason: str | None
    initial_tasks: int | None
    remaining_tasks: int | None
    started_at: dt.datetime | None
    completed_at: dt.datetime | None
    failed_at: dt.datetime | None


@dataclass(frozen=True)
class RunState(Generic[S]):
    """A run with its steps, read in one statement (``pgflow.get_run_with_states``).

    Attributes:
        run_id, flow_slug, status, remaining_steps: the run.
        input: the run input (the application's own data; never printed by the command line).
        output: the run output once completed.
        steps: every step in definition order.
    """

    run_id: str
    flow_slug: str
    status: str
    input: Any
    output: dict[S, Any] | None
    remaining_steps: int
    started_at: dt.datetime
    completed_at: dt.datetime | None
    failed_at: dt.datetime | None
    steps: tuple[StepState[S], ...] = field(default_factory=tuple)

    @property
    def step_outputs(self) -> dict[S, Any]:
        """``{step: output}`` of every completed step (not only the leaves)."""
        return {step.step_slug: step.output for step in self.steps if step.status == "completed"}

    def step(self, slug: S) -> StepState[S]:
        """The state of step ``slug``.

        Raises:
            KeyError: the flow has no such step.
        """
        for step in self.steps:
            if step.step_slug == slug:
                return step
        raise KeyError(slug)


# --------------------------------------------------------------------------------------------
# inputs and statements
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RawJson:
    """A run input given as JSON text (a file, a request body): checked by
    :func:`pgflow_cli.jsoncheck.parse_text` and sent as written, so numbers keep every digit."""

    text: str


def flow_slug_of(flow: FlowRef[Any]) -> str:
    """The slug of a flow object, or the slug itself.

    Raises:
        UsageError: neither a string nor an object with a ``slug``.
    """
    if isinstance(flow, str):
        if not flow:
            raise UsageError("a flow slug is required")
        return flow
    slug = getattr(flow, "slug", None)
    if not isinstance(slug, str):
        raise UsageError(f"expected a flow or a flow slug, got {type(flow).__name__}")
    return slug


def run_id_of(run: RunRef[Any]) -> str:
    """The canonical text of a run id (from a :class:`Run`, a :class:`RunOutcome`, a UUID or text).

    Raises:
        UsageError: not a UUID.
    """
    value = run.run_id if isinstance(run, (Run, RunOutcome)) else run
    try:
        return str(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value).strip()))
    except ValueError:
        raise UsageError(f"{str(value)!r} is not a run id (a UUID)") from None


def _json_param(value: Any, what: str) -> Any:
    """The value to bind for a ``jsonb`` parameter, checked first: JSON text for :class:`RawJson`
    (sent as written), else the value wrapped for psycopg."""
    if isinstance(value, RawJson):
        jsoncheck.parse_text(value.text, what=what)
        return value.text
    jsoncheck.check_value(value, what=what)
    return Jsonb(value)


def _json_text(value: Any, what: str) -> str:
    """``value`` as checked JSON text (one element of a JSON array built from several inputs)."""
    checked = _json_param(value, what)
    return checked if isinstance(checked, str) else json.dumps(value)


@dataclass(frozen=True)
class Statement:
    """A named statement of ``sql/queries/client.sql`` with its parameters."""

    name: str
    params: Mapping[str, Any]

    @property
    def sql(self) -> str:
        return sqlfiles.statement(QUERIES, self.name)


def start_statement(flow: FlowRef[Any], input: Any, run_id: str | uuid.UUID | None) -> Statement:
    """``start``: checks the input (exit 2 with its path) before anything is sent."""
    return Statement("start", {"flow_slug": flow_slug_of(flow), "input": _json_param(input, "the run input"),
                               "run_id": run_id_of(run_id) if run_id is not None else None})


def start_many_statement(flow: FlowRef[Any], inputs: Sequence[Any] | RawJson) -> Statement:
    """``start_many``: ``inputs`` is a sequence of inputs (each may be :class:`RawJson`) or one
    :class:`RawJson` holding a JSON array."""
    if isinstance(inputs, RawJson):
        value = _json_param(inputs, "the run inputs")
    elif isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
        raise UsageError("start_many takes a list of run inputs")
    elif any(isinstance(item, RawJson) for item in inputs):
        value = "[" + ",".join(_json_text(item, f"run input {i}") for i, item in enumerate(inputs)) + "]"
    else:
        jsoncheck.check_value(list(inputs), what="the run inputs")
        value = Jsonb(list(inputs))
    return Statement("start_many", {"flow_slug": flow_slug_of(flow), "inputs": value})


def get_statement(run: RunRef[Any]) -> Statement:
    return Statement("get", {"run_id": run_id_of(run)})


def poll_statement(run_ids: Sequence[str]) -> Statement:
    return Statement("poll", {"run_ids": list(run_ids)})


def run_from_row(row: Sequence[Any], record: Sequence[Any] | None = None) -> Run[Any]:
    """A :class:`Run` from a ``start``/``start_many`` row (``retry``/``resume`` rows also carry
    ``restart_of_run_id`` and ``cancel_reason``; a ``cancel`` row has them in ``record``, the
    ``cancel_record`` row read after it)."""
    run_id, flow_slug, status, remaining_steps, started_at = row[:5]
    restart_of, reason = (row[7], row[8]) if len(row) > 8 else (None, None)
    if record is not None:
        restart_of, reason = record[0], record[1]
    return Run(str(run_id), flow_slug, status, remaining_steps, started_at,
               str(restart_of) if restart_of is not None else None, reason)


def retry_statement(run: RunRef[Any]) -> Statement:
    return Statement("retry", {"run_id": run_id_of(run)})


def resume_statement(run: RunRef[Any]) -> Statement:
    return Statement("resume", {"run_id": run_id_of(run)})


def cancel_statement(run: RunRef[Any], reason: str | None) -> Statement:
    if reason is not None and len(reason) > MAX_CANCEL_REASON:
        raise UsageError(f"the cancel reason is {len(reason)} characters long; at most {MAX_CANCEL_REASON} are kept")
    return Statement("cancel", {"run_id": run_id_of(run), "reason": reason})


def cancel_record_statement(run: RunRef[Any]) -> Statement:
    return Statement("cancel_record", {"run_id": run_id_of(run)})


MAX_CANCEL_REASON = 1000
"""Longest reason ``cancel`` records (``pgflow.cancel_run`` refuses a longer one)."""


_FRACTION = re.compile(r"\.(\d{1,6})")


def timestamp(value: Any) -> dt.datetime | None:
    """A timestamp from ``to_jsonb`` text (any number of fraction digits; Python 3.10's
    :meth:`~datetime.datetime.fromisoformat` takes only 3 or 6)."""
    if value is None or isinstance(value, dt.datetime):
        return value
    text = _FRACTION.sub(lambda m: "." + m.group(1).ljust(6, "0"), str(value), count=1)
    return dt.datetime.fromisoformat(text)


def state_from_document(document: Mapping[str, Any]) -> RunState[Any]:
    """A :class:`RunState` from ``get_run_with_states``' document."""
    run = document["run"]
    steps = tuple(
        StepState(step["step_slug"], step["status"], step.get("output"), step.get("error_message"),
                  step.get("skip_reason"), step.get("initial_tasks"), step.get("remaining_tasks"),
                  timestamp(step.get("started_at")), timestamp(step.get("completed_at")),
                  timestamp(step.get("failed_at")))
        for step in document.get("steps") or ())
    started = timestamp(run["started_at"])
    assert started is not None
    return RunState(str(run["run_id"]), run["flow_slug"], run["status"], run.get("input"), run.get("output"),
                    run["remaining_steps"], started, timestamp(run.get("completed_at")),
                    timestamp(run.get("failed_at")), steps)


def outcome_from_row(row: Mapping[str, Any]) -> RunOutcome[Any]:
    """A :class:`RunOutcome` from a ``poll`` row of an ended run."""
    failures = tuple(
        StepFailure(item["step_slug"], item.get("error_message"),
                    tuple(TaskFailure(t["task_index"], t.get("error_message"), t["attempts_count"])
                          for t in item.get("tasks") or ()))
        for item in row["failures"] or ())
    ended = row["completed_at"] or row["failed_at"]
    return RunOutcome(str(row["run_id"]), row["flow_slug"], row["status"], row["output"], failures,
                      row["remaining_steps"], row["started_at"], ended)


@contextmanager
def translated(run_id: str | None = None) -> Iterator[None]:
    """Turn the database's refusals of a client call into the client's errors: an unknown flow or run
    (PF006), a run in the wrong state for a cancel or restart (PF013), an input the flow cannot take
    (22023, 22004), a schema without ``start_flows`` (42883).
    Every other psycopg error passes unchanged."""
    try:
        yield
    except psycopg.Error as exc:
        sqlstate = getattr(exc, "sqlstate", None)
        diag = getattr(exc, "diag", None)
        message = ((diag.message_primary if diag else None) or str(exc)).strip()
        hint = (diag.message_hint if diag else None) or ""
        if sqlstate == "PF006":
            if run_id is not None:
                raise RunNotFound(f"no run {run_id}", hint="`pgflow runs list` shows the run ids") from None
            raise FlowNotFound(message, hint=hint or "start a worker of the flow first: startup creates it") from None
        if sqlstate == "PF013":
            raise RunStateConflict(message, hint=hint) from None
        if sqlstate in ("22023", "22004"):
            raise InvalidInput(message, hint=hint) from None
        if sqlstate == "42883" and any(f"{name}(" in message for name in ("cancel_run", "retry_run", "resume_run")):
            raise SchemaMissing(f"{message}: this database's pgflow schema predates cancelling and restarting runs",
                                hint="run `pgflow migrate apply`") from None
        if sqlstate == "42883" and "start_flows" in message:
            raise SchemaMissing(f"{message}: this database's pgflow schema predates starting many runs at once",
                                hint="run `pgflow migrate apply`, or start the runs one by one") from None
        raise


def in_callers_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """True when ``conn`` is inside a transaction: the client then works in a savepoint of it and never
    commits or rolls it back. Otherwise one statement is its own transaction (autocommit), or opens the
    implicit transaction a non-autocommit connection's owner commits.

    Raises:
        UsageError: the connection's transaction has already failed (the caller must roll it back).
    """
    status = conn.info.transaction_status
    if status == pq.TransactionStatus.INERROR:
        raise UsageError("the connection's transaction has failed; roll it back before starting runs in it")
    return status == pq.TransactionStatus.INTRANS


# --------------------------------------------------------------------------------------------
# waiting: the wait book (one poll statement for every run due, bounded backoff per run)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PollPolicy:
    """How often an awaited run is looked at, and how long a lost connection is retried.

    A run is first looked at when its wait begins, then after ``first_interval`` seconds, each
    interval ``factor`` times the one before, never more than ``max_interval``. Every run due at the
    same moment (within a quarter of its own interval) is read by the same statement, and two
    statements are at least ``first_interval`` apart, so a client waiting for 1,000 runs sends about
    as many statements as one waiting for one run.

    Attributes:
        first_interval: seconds before the second look (also the least time between two statements).
        factor: growth of the interval, at least 1.
        max_interval: the longest interval, seconds: the most a run's end may go unnoticed.
        reconnect_timeout: seconds to keep reconnecting after the connection is lost (a server
            restart, a failover) before the waits fail with :class:`~pgflow_cli.errors.ConnectionFailed`.
    """

    first_interval: float = 0.05
    factor: float = 1.5
    max_interval: float = 2.0
    reconnect_timeout: float = 30.0

    def __post_init__(self) -> None:
        if not 0 < self.first_interval <= self.max_interval:
            raise UsageError("PollPolicy: need 0 < first_interval <= max_interval")
        if self.factor < 1:
            raise UsageError("PollPolicy: factor must be at least 1")
        if self.reconnect_timeout < 0:
            raise UsageError("PollPolicy: reconnect_timeout must not be negative")



class Reconnect:
    """The pauses between attempts to reopen a lost connection: from the policy's ``first_interval``
    doubling up to 2 s, until ``reconnect_timeout`` seconds have passed since the loss."""

    def __init__(self, policy: PollPolicy, now: float) -> None:
        self.policy = policy
        self.give_up = now + policy.reconnect_timeout
        self._delay = policy.first_interval

    def next_delay(self, now: float) -> float | None:
        """Seconds to pause before the next attempt, or ``None``: give up."""
        if now >= self.give_up:
            return None
        delay = min(self._delay, self.give_up - now)
        self._delay = min(self._delay * 2, 2.0)
        return delay

    def gave_up(self, target: str, exc: BaseException) -> ConnectionFailed:
        """The error every wait gets when the connection could not be restored."""
        return ConnectionFailed(
            f"lost the connection to {target} while waiting for runs and could not reconnect within "
            f"{self.policy.reconnect_timeout:g} s: {first_line(exc)}",
            hint="the runs go on in the database; wait for them again once the server is back "
            "(pgflow runs wait RUN_ID)")


class WaitClock:
    """One wait's deadline, and how long its caller may sleep before it must look again (for the
    deadline, or to report progress every ``progress_every`` seconds)."""

    def __init__(self, timeout: float | None, progress_every: float | None) -> None:
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        self.progress_every = progress_every

    def pause(self) -> float | None:
        """Seconds to sleep (``None``: until woken)."""
        left = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
        if self.progress_every is None:
            return left
        return self.progress_every if left is None else min(left, self.progress_every)

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


@dataclass
class _Entry:
    interval: float
    next_look: float
    waiters: int = 1
    progress: RunProgress | None = None


@dataclass
class WaitStats:
    """What a client's waits cost it: poll statements sent, run ids they read, reconnections."""

    polls: int = 0
    runs_read: int = 0
    reconnects: int = 0


class WaitBook:
    """The runs a client awaits and when to look at each (no I/O; one per client).

    A driver loop: :meth:`add` a run per wait (several waits of one run share it), sleep until
    :meth:`next_wake`, send :func:`poll_statement` of :meth:`due`, give the rows to :meth:`record`,
    which returns the runs that ended (or vanished); :meth:`discard` a wait that gave up.
    """

    def __init__(self, policy: PollPolicy) -> None:
        self.policy = policy
        self._entries: dict[str, _Entry] = {}
        self._last_poll = float("-inf")
        self.stats = WaitStats()

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, run_id: str, now: float) -> None:
        """Await ``run_id`` (looked at by the next statement)."""
        entry = self._entries.get(run_id)
        if entry is None:
            self._entries[run_id] = _Entry(self.policy.first_interval, now, progress=RunProgress(run_id))
        else:
            entry.waiters += 1

    def discard(self, run_id: str) -> None:
        """One wait of ``run_id`` gave up (deadline, cancellation)."""
        entry = self._entries.get(run_id)
        if entry is not None:
            entry.waiters -= 1
            if entry.waiters <= 0:
                del self._entries[run_id]

    def progress(self, run_id: str) -> RunProgress | None:
        entry = self._entries.get(run_id)
        return entry.progress if entry else None

    def next_wake(self) -> float | None:
        """When the next statement is due (monotonic seconds), or ``None`` with nothing to await."""
        if not self._entries:
            return None
        earliest = min(entry.next_look for entry in self._entries.values())
        return max(earliest, self._last_poll + self.policy.first_interval)

    def due(self, now: float) -> list[str]:
        """The runs to read now: those due, and those due within a quarter of their own interval."""
        return [run_id for run_id, entry in self._entries.items() if entry.next_look <= now + entry.interval / 4]

    def record(self, run_ids: Iterable[str], rows: Iterable[Mapping[str, Any]], now: float,
               wall: dt.datetime) -> dict[str, RunOutcome[Any] | Exception]:
        """Take a poll's rows; returns ``{run_id: outcome}`` for every read run that ended, and a
        :class:`RunNotFound` for every read run without a row. Those are no longer awaited; the rest
        are looked at again after a longer interval."""
        self._last_poll = now
        read = list(run_ids)
        self.stats.polls += 1
        self.stats.runs_read += len(read)
        found = {str(row["run_id"]): row for row in rows}
        ended: dict[str, RunOutcome[Any] | Exception] = {}
        for run_id in read:
            entry = self._entries.get(run_id)
            if entry is None:
                continue
            row = found.get(run_id)
            if row is None:
                ended[run_id] = RunNotFound(f"no run {run_id}",
                                            hint="it was never started, its transaction has not committed, "
                                            "or it was deleted (pruning, drop-flow)")
            elif row["status"] != "started":
                ended[run_id] = outcome_from_row(row)
            else:
                entry.progress = RunProgress(run_id, row["status"], row["remaining_steps"], wall)
                entry.interval = min(entry.interval * self.policy.factor, self.policy.max_interval)
                entry.next_look = now + entry.interval
                continue
            del self._entries[run_id]
        return ended

    def fail_all(self) -> list[str]:
        """Stop awaiting everything (the connection could not be restored); returns the run ids."""
        run_ids = list(self._entries)
        self._entries.clear()
        return run_ids

"""The synchronous run client: :class:`Client` and the functions that work on a caller's connection."""

from __future__ import annotations

import datetime as dt
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import psycopg
from psycopg.rows import dict_row

from pgflow_cli import db
from pgflow_cli.client import core
from pgflow_cli.client.core import (
    FlowRef,
    PollPolicy,
    Run,
    RunOutcome,
    RunProgress,
    RunRef,
    RunState,
    S,
    Statement,
    WaitBook,
    WaitTimeout,
)
from pgflow_cli.errors import ConnectionFailed

ProgressCallback = Callable[[RunProgress], None]


def _execute(conn: psycopg.Connection[Any], statement: Statement, *, run_id: str | None = None) -> list[Any]:
    with core.translated(run_id), conn.cursor() as cur:
        if core.in_callers_transaction(conn):
            with conn.transaction():
                return cur.execute(statement.sql, statement.params).fetchall()
        return cur.execute(statement.sql, statement.params).fetchall()


@overload
def start_run(conn: psycopg.Connection[Any], flow: str, input: Any, *, run_id: Any = None) -> Run[str]: ...
@overload
def start_run(conn: psycopg.Connection[Any], flow: FlowRef[S], input: Any, *, run_id: Any = None) -> Run[S]: ...
def start_run(conn: psycopg.Connection[Any], flow: FlowRef[Any], input: Any, *, run_id: Any = None) -> Run[Any]:
    """Start one run of ``flow`` on the caller's connection (``pgflow.start_flow``).

    Inside the caller's transaction the start joins it in a savepoint: it commits or rolls back
    with the caller's own rows, and a refusal (unknown flow, bad input) leaves that transaction
    usable. On an autocommit connection outside a transaction the one statement is its own
    transaction. Nothing here commits or rolls back a transaction the caller opened.

    Args:
        conn: a psycopg connection.
        flow: a :class:`pgflow_cli.worker.Flow` (or step-queued flow), or a flow slug.
        input: the run input: any JSON value (checked first: see :mod:`pgflow_cli.jsoncheck`), or
            :class:`~pgflow_cli.client.RawJson` text. A flow with a root map step takes an array.
        run_id: the run's id (a UUID), to make a retried start idempotent; random by default.

    Returns:
        The run as it started.

    Raises:
        JsonValueError: an input PostgreSQL would refuse, with the path of the bad value (exit 2).
        InvalidInput: the flow cannot take this input (not an array for a root map step; exit 2).
        FlowNotFound: no such flow (exit 6).
        psycopg.Error: anything else the database raised (a duplicate ``run_id``: UniqueViolation).
    """
    return core.run_from_row(_execute(conn, core.start_statement(flow, input, run_id))[0])


@overload
def start_runs(conn: psycopg.Connection[Any], flow: str, inputs: Any) -> list[Run[str]]: ...
@overload
def start_runs(conn: psycopg.Connection[Any], flow: FlowRef[S], inputs: Any) -> list[Run[S]]: ...
def start_runs(conn: psycopg.Connection[Any], flow: FlowRef[Any], inputs: Any) -> list[Run[Any]]:
    """Start one run per input in one statement (``pgflow.start_flows``), in input order; all or none.

    Args:
        conn: as :func:`start_run` (the caller's transaction is joined the same way).
        flow: a flow object or slug.
        inputs: a list of run inputs (each a JSON value or :class:`~pgflow_cli.client.RawJson`), or one
            ``RawJson`` holding a JSON array of them.

    Returns:
        The runs, in the order of ``inputs``.

    Raises:
        As :func:`start_run`; InvalidInput names the 0-based index of a bad element; SchemaMissing on
        the baseline schema (no ``start_flows``).
    """
    return [core.run_from_row(row) for row in _execute(conn, core.start_many_statement(flow, inputs))]


def retry_run(conn: psycopg.Connection[Any], run: RunRef[Any]) -> Run[Any]:
    """Retry a failed (or cancelled) run as a fresh run of the same flow and input
    (``pgflow.retry_run``): nothing of the source is reused, and the source stays as it is.

    Args:
        conn: a connection of an operator role (the owner of the pgflow tables or a member of
            ``pgflow_operator``: docs/permissions.md "Run operators"); your transaction is joined as
            :func:`start_run` joins it.
        run: the failed run: its id, or what :func:`start_run` returned.

    Returns:
        The new run as it started; ``restart_of_run_id`` names the source.

    Raises:
        RunNotFound: no such run (exit 6).
        RunStateConflict: the run is not failed (exit 6).
        InvalidInput: the flow, as compiled now, cannot take the source's input (exit 2).
        SchemaMissing: a schema older than migration 0003 (exit 3).
        psycopg.errors.InsufficientPrivilege: not an operator (42501).
    """
    run_id = core.run_id_of(run)
    return core.run_from_row(_execute(conn, core.retry_statement(run_id), run_id=run_id)[0])


def resume_run(conn: psycopg.Connection[Any], run: RunRef[Any]) -> Run[Any]:
    """Resume a failed (or cancelled) run (``pgflow.resume_run``): a new run of the same flow and
    input that reuses every task the source completed, map elements included, and queues only the
    others; conditions and empty maps are decided again as on a fresh run. The source stays as it is.

    Args:
        conn: as :func:`retry_run`.
        run: the failed run.

    Returns:
        The new run as it started; ``restart_of_run_id`` names the source.

    Raises:
        As :func:`retry_run`; RunStateConflict also when the flow was compiled again after the
        source started (retry it instead).
    """
    run_id = core.run_id_of(run)
    return core.run_from_row(_execute(conn, core.resume_statement(run_id), run_id=run_id)[0])


def cancel_run(conn: psycopg.Connection[Any], run: RunRef[Any], reason: str | None = None) -> Run[Any]:
    """Cancel a started run (``pgflow.cancel_run``): it ends failed with ``reason`` recorded, its
    queued and started tasks (manual ones too) are cancelled and their messages archived; a worker's
    later report of them is refused and counted. A run cancelled already is returned unchanged.

    Args:
        conn: as :func:`retry_run`.
        run: the run to cancel.
        reason: why, at most 1000 characters (default: "cancelled by <role>").

    Returns:
        The run after the cancel: status ``failed``, ``cancel_reason`` set.

    Raises:
        RunNotFound: no such run (exit 6).
        RunStateConflict: the run already completed or failed on its own (exit 6).
        UsageError: a reason longer than 1000 characters (exit 2).
        SchemaMissing, psycopg.errors.InsufficientPrivilege: as :func:`retry_run`.
    """
    run_id = core.run_id_of(run)
    row = _execute(conn, core.cancel_statement(run_id, reason), run_id=run_id)[0]
    return core.run_from_row(row, _execute(conn, core.cancel_record_statement(run_id), run_id=run_id)[0])


def get_run(conn: psycopg.Connection[Any], run: RunRef[Any]) -> RunState[Any]:
    """Read a run and all its step states in one statement (``pgflow.get_run_with_states``).

    Args:
        conn: any psycopg connection (inside a transaction it sees that transaction's runs).
        run: a run id, or what :func:`start_run` returned.

    Raises:
        RunNotFound: no such run (exit 6).
    """
    run_id = core.run_id_of(run)
    return core.state_from_document(_execute(conn, core.get_statement(run_id), run_id=run_id)[0][0])


@dataclass(eq=False)
class _Slot:
    done: threading.Event = field(default_factory=threading.Event)
    outcome: RunOutcome[Any] | None = None
    error: BaseException | None = None
    ended: queue.SimpleQueue[_Slot] | None = None
    """Where the slot is put when its run ends (:meth:`Client.as_completed`)."""


class _Waiter:
    """One thread and one connection awaiting every run of a :class:`Client` (a :class:`WaitBook`).

    The thread runs while there is something to await and exits when nothing is left; the connection
    stays open for the next wait. A lost connection is reopened with the policy's backoff; when that
    fails for ``reconnect_timeout`` seconds, every wait fails with ConnectionFailed.
    """

    def __init__(self, target: db.Target, policy: PollPolicy, connect_timeout: int, application_name: str) -> None:
        self._target = target
        self._connect_timeout = connect_timeout
        self._application_name = application_name
        self._book = WaitBook(policy)
        self._slots: dict[str, list[_Slot]] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        self._closing = threading.Event()

    @property
    def stats(self) -> core.WaitStats:
        return self._book.stats

    def register(self, run_id: str, ended: queue.SimpleQueue[_Slot] | None = None) -> _Slot:
        slot = _Slot(ended=ended)
        with self._cond:
            if self._closed:
                raise RuntimeError("the client is closed")
            self._book.add(run_id, time.monotonic())
            self._slots.setdefault(run_id, []).append(slot)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="pgflow-client-wait", daemon=True)
                self._thread.start()
            self._cond.notify()
        return slot

    def unregister(self, run_id: str, slot: _Slot) -> None:
        with self._cond:
            slots = self._slots.get(run_id, [])
            if slot in slots:
                slots.remove(slot)
                self._book.discard(run_id)
                if not slots:
                    self._slots.pop(run_id, None)

    def progress(self, run_id: str) -> RunProgress | None:
        with self._cond:
            return self._book.progress(run_id)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._closing.set()
            for run_id in self._book.fail_all():
                self._settle(run_id, RuntimeError("the client was closed while waiting"))
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(10)
        if self._conn is not None:
            self._conn.close()

    def _settle(self, run_id: str, result: RunOutcome[Any] | BaseException) -> None:
        for slot in self._slots.pop(run_id, []):
            if isinstance(result, BaseException):
                slot.error = result
            else:
                slot.outcome = result
            slot.done.set()
            if slot.ended is not None:
                slot.ended.put(slot)

    def _loop(self) -> None:
        while True:
            with self._cond:
                wake = self._book.next_wake()
                if wake is None or self._closed:
                    self._thread = None
                    return
                now = time.monotonic()
                if wake > now:
                    self._cond.wait(wake - now)
                    continue
                run_ids = self._book.due(now)
            try:
                rows = self._poll(run_ids)
            except BaseException as exc:
                with self._cond:
                    for run_id in run_ids if not isinstance(exc, ConnectionFailed) else self._book.fail_all():
                        self._book.discard(run_id)
                        self._settle(run_id, exc)
                continue
            with self._cond:
                ended = self._book.record(run_ids, rows, time.monotonic(), dt.datetime.now(dt.timezone.utc))
                for run_id, result in ended.items():
                    self._settle(run_id, result)

    def _connect(self) -> psycopg.Connection[Any]:
        conn = db.connect(self._target, application_name=self._application_name, connect_timeout=self._connect_timeout)
        conn.prepare_threshold = None  # no server-side prepared statements: fine behind a transaction pooler
        return conn

    def _poll(self, run_ids: Sequence[str]) -> list[dict[str, Any]]:
        """One poll statement, reconnecting (with the policy's backoff) when the connection is lost."""
        statement = core.poll_statement(run_ids)
        reconnect: core.Reconnect | None = None
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                with self._conn.cursor(row_factory=dict_row) as cur:
                    rows = cur.execute(statement.sql, statement.params).fetchall()
                if reconnect is not None:
                    self._book.stats.reconnects += 1
                return rows
            except (psycopg.OperationalError, ConnectionFailed) as exc:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                reconnect = reconnect or core.Reconnect(self._book.policy, time.monotonic())
                delay = reconnect.next_delay(time.monotonic())
                if delay is None:
                    raise reconnect.gave_up(self._target.describe(), exc) from None
                if self._closing.wait(delay):
                    raise ConnectionFailed("the client was closed while reconnecting") from None

class Client:
    """Start runs, read them and await their end, on a database given by its connection string.

    The client opens its connections when first needed: one for starting and reading (shared by
    threads), and one for awaiting, used by one background thread that reads every awaited run in
    one statement per look (:class:`~pgflow_cli.client.PollPolicy`). Neither keeps session state
    (no LISTEN, no server-side prepared statements), so a transaction-mode pooler may stand between.

    To start runs inside your own transaction, pass your connection (``conn=``) or use
    :func:`start_run` / :func:`start_runs` directly; then await them after you committed.

    Args:
        conninfo: libpq connection string or URL (or a resolved :class:`pgflow_cli.db.Target`); ``None``:
            ``PGFLOW_DATABASE_URL``, ``DATABASE_URL``, then libpq's ``PG*`` variables, as the command line does.
        connect_timeout: seconds libpq waits for the server on each connection.
        poll: how often awaited runs are looked at and how long a lost connection is retried.
        application_name: shown in ``pg_stat_activity``.

    Example::

        from pgflow_cli.client import Client

        with Client("postgresql://app@db/app") as client:
            run = client.start(greet, {"first": "Ada", "last": "Lovelace"})
            output = client.wait(run, timeout=30)      # {"greeting": "Hello, Ada Lovelace!"}
    """

    def __init__(self, conninfo: str | db.Target | None = None, *, connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
                 poll: PollPolicy | None = None, application_name: str = "pgflow-client") -> None:
        self.target = conninfo if isinstance(conninfo, db.Target) else db.resolve_target(conninfo)
        self.poll = poll or PollPolicy()
        self._connect_timeout = connect_timeout
        self._application_name = application_name
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._waiter = _Waiter(self.target, self.poll, connect_timeout, application_name)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections; waits still in progress fail."""
        self._waiter.close()
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @property
    def stats(self) -> core.WaitStats:
        """What awaiting has cost so far (poll statements, run ids read, reconnections)."""
        return self._waiter.stats

    def _connection(self, conn: psycopg.Connection[Any] | None) -> psycopg.Connection[Any]:
        if conn is not None:
            return conn
        with self._lock:
            if self._conn is None or self._conn.closed:
                self._conn = db.connect(self.target, application_name=self._application_name,
                                        connect_timeout=self._connect_timeout)
                self._conn.prepare_threshold = None
            return self._conn

    @overload
    def start(self, flow: str, input: Any, *, run_id: Any = None, conn: psycopg.Connection[Any] | None = None
              ) -> Run[str]: ...
    @overload
    def start(self, flow: FlowRef[S], input: Any, *, run_id: Any = None, conn: psycopg.Connection[Any] | None = None
              ) -> Run[S]: ...
    def start(self, flow: FlowRef[Any], input: Any, *, run_id: Any = None,
              conn: psycopg.Connection[Any] | None = None) -> Run[Any]:
        """Start one run: :func:`start_run` on ``conn`` (your transaction) or on the client's connection."""
        return start_run(self._connection(conn), flow, input, run_id=run_id)

    @overload
    def start_many(self, flow: str, inputs: Any, *, conn: psycopg.Connection[Any] | None = None) -> list[Run[str]]: ...
    @overload
    def start_many(self, flow: FlowRef[S], inputs: Any, *, conn: psycopg.Connection[Any] | None = None
                   ) -> list[Run[S]]: ...
    def start_many(self, flow: FlowRef[Any], inputs: Any, *, conn: psycopg.Connection[Any] | None = None
                   ) -> list[Run[Any]]:
        """Start one run per input in one statement: :func:`start_runs`."""
        return start_runs(self._connection(conn), flow, inputs)

    def retry(self, run: RunRef[Any], *, conn: psycopg.Connection[Any] | None = None) -> Run[Any]:
        """Retry a failed run as a fresh run: :func:`retry_run`."""
        return retry_run(self._connection(conn), run)

    def resume(self, run: RunRef[Any], *, conn: psycopg.Connection[Any] | None = None) -> Run[Any]:
        """Resume a failed run, reusing every task it completed: :func:`resume_run`."""
        return resume_run(self._connection(conn), run)

    def cancel(self, run: RunRef[Any], reason: str | None = None, *,
               conn: psycopg.Connection[Any] | None = None) -> Run[Any]:
        """Cancel a started run: :func:`cancel_run`."""
        return cancel_run(self._connection(conn), run, reason)

    def get(self, run: RunRef[S], *, conn: psycopg.Connection[Any] | None = None) -> RunState[S]:
        """A run with its steps: :func:`get_run`."""
        return get_run(self._connection(conn), run)

    def outcome(self, run: RunRef[S], *, timeout: float | None = None, on_progress: ProgressCallback | None = None,
                progress_every: float = 5.0) -> RunOutcome[S]:
        """Await the end of a run and return how it ended (a failed run is an outcome, not an error).

        Args:
            run: a run id or what :meth:`start` returned (committed: the waiting connection must see it).
            timeout: seconds to wait at most; ``None``: no limit.
            on_progress: called in the calling thread every ``progress_every`` seconds while the run
                goes on, with where it stood at the last look (no extra statement).
            progress_every: seconds between ``on_progress`` calls.

        Raises:
            WaitTimeout: ``timeout`` passed first (exit 5); the run goes on.
            RunNotFound: no such run (exit 6).
            ConnectionFailed: the connection was lost and could not be restored in time (exit 3).
        """
        run_id = core.run_id_of(run)
        slot = self._waiter.register(run_id)
        clock = core.WaitClock(timeout, progress_every if on_progress is not None else None)
        try:
            while not slot.done.wait(clock.pause()):
                progress = self._waiter.progress(run_id)
                if clock.expired():
                    raise WaitTimeout(run_id, timeout, progress)
                if on_progress is not None and progress is not None:
                    on_progress(progress)
        finally:
            if not slot.done.is_set():
                self._waiter.unregister(run_id, slot)
        if slot.error is not None:
            raise slot.error
        assert slot.outcome is not None
        return slot.outcome

    def wait(self, run: RunRef[S], *, timeout: float | None = None, on_progress: ProgressCallback | None = None,
             progress_every: float = 5.0) -> dict[S, Any]:
        """Await the end of a run and return its output (``{leaf_step: output}``).

        Raises:
            RunFailed: the run failed; ``.failures`` holds the failed steps and their errors (exit 1).
            WaitTimeout, RunNotFound, ConnectionFailed: as :meth:`outcome`.
        """
        return self.outcome(run, timeout=timeout, on_progress=on_progress, progress_every=progress_every).result()

    def as_completed(self, runs: Sequence[RunRef[S]], *, timeout: float | None = None) -> Iterator[RunOutcome[S]]:
        """Await many runs at once (one statement per look for all of them) and yield each outcome as
        its run ends; a failed run is an outcome (``ok`` false), not an error.

        Args:
            runs: run ids, or what :meth:`start` / :meth:`start_many` returned.
            timeout: seconds for all of them; ``None``: no limit.

        Raises:
            WaitTimeout: ``timeout`` passed before every run ended (it names one still going).
            RunNotFound, ConnectionFailed: as :meth:`outcome`.
        """
        ended: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        slots = [(run_id, self._waiter.register(run_id, ended)) for run_id in map(core.run_id_of, runs)]
        clock = core.WaitClock(timeout, None)
        try:
            for _ in slots:
                try:
                    slot = ended.get(timeout=clock.pause())
                except queue.Empty:
                    going = next(run_id for run_id, slot in slots if not slot.done.is_set())
                    raise WaitTimeout(going, timeout, self._waiter.progress(going)) from None
                if slot.error is not None:
                    raise slot.error
                assert slot.outcome is not None
                yield slot.outcome
        finally:
            for run_id, slot in slots:
                if not slot.done.is_set():
                    self._waiter.unregister(run_id, slot)

    def wait_all(self, runs: Sequence[RunRef[S]], *, timeout: float | None = None) -> list[RunOutcome[S]]:
        """Await many runs at once (:meth:`as_completed`); the outcomes in the order of ``runs``."""
        outcomes = {outcome.run_id: outcome for outcome in self.as_completed(runs, timeout=timeout)}
        return [outcomes[core.run_id_of(run)] for run in runs]

    @overload
    def run(self, flow: str, input: Any, *, timeout: float | None = None) -> dict[str, Any]: ...
    @overload
    def run(self, flow: FlowRef[S], input: Any, *, timeout: float | None = None) -> dict[S, Any]: ...
    def run(self, flow: FlowRef[Any], input: Any, *, timeout: float | None = None) -> dict[Any, Any]:
        """Start a run and await its output: :meth:`start` then :meth:`wait`.

        Raises:
            RunFailed: the run failed (exit 1); WaitTimeout: it did not end in ``timeout`` seconds.
        """
        return self.wait(self.start(flow, input), timeout=timeout)




"""The asyncio run client: :class:`AsyncClient` and the functions that work on a caller's
:class:`psycopg.AsyncConnection`. Same statements, rules and results as :mod:`pgflow_cli.client.sync`."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import AsyncIterator, Callable, Sequence
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


async def _execute(conn: psycopg.AsyncConnection[Any], statement: Statement, *, run_id: str | None = None
                   ) -> list[Any]:
    with core.translated(run_id):
        async with conn.cursor() as cur:
            if core.in_callers_transaction(conn):
                async with conn.transaction():
                    await cur.execute(statement.sql, statement.params)
                    return await cur.fetchall()
            await cur.execute(statement.sql, statement.params)
            return await cur.fetchall()


@overload
async def start_run_async(conn: psycopg.AsyncConnection[Any], flow: str, input: Any, *, run_id: Any = None
                          ) -> Run[str]: ...
@overload
async def start_run_async(conn: psycopg.AsyncConnection[Any], flow: FlowRef[S], input: Any, *, run_id: Any = None
                          ) -> Run[S]: ...
async def start_run_async(conn: psycopg.AsyncConnection[Any], flow: FlowRef[Any], input: Any, *,
                          run_id: Any = None) -> Run[Any]:
    """:func:`pgflow_cli.client.start_run` on an asyncio connection (the caller's transaction joined the
    same way, never committed or rolled back here)."""
    return core.run_from_row((await _execute(conn, core.start_statement(flow, input, run_id)))[0])


@overload
async def start_runs_async(conn: psycopg.AsyncConnection[Any], flow: str, inputs: Any) -> list[Run[str]]: ...
@overload
async def start_runs_async(conn: psycopg.AsyncConnection[Any], flow: FlowRef[S], inputs: Any) -> list[Run[S]]: ...
async def start_runs_async(conn: psycopg.AsyncConnection[Any], flow: FlowRef[Any], inputs: Any) -> list[Run[Any]]:
    """:func:`pgflow_cli.client.start_runs` on an asyncio connection."""
    return [core.run_from_row(row) for row in await _execute(conn, core.start_many_statement(flow, inputs))]


async def retry_run_async(conn: psycopg.AsyncConnection[Any], run: RunRef[Any]) -> Run[Any]:
    """:func:`pgflow_cli.client.retry_run` on an asyncio connection."""
    run_id = core.run_id_of(run)
    return core.run_from_row((await _execute(conn, core.retry_statement(run_id), run_id=run_id))[0])


async def resume_run_async(conn: psycopg.AsyncConnection[Any], run: RunRef[Any]) -> Run[Any]:
    """:func:`pgflow_cli.client.resume_run` on an asyncio connection."""
    run_id = core.run_id_of(run)
    return core.run_from_row((await _execute(conn, core.resume_statement(run_id), run_id=run_id))[0])


async def cancel_run_async(conn: psycopg.AsyncConnection[Any], run: RunRef[Any], reason: str | None = None
                           ) -> Run[Any]:
    """:func:`pgflow_cli.client.cancel_run` on an asyncio connection."""
    run_id = core.run_id_of(run)
    row = (await _execute(conn, core.cancel_statement(run_id, reason), run_id=run_id))[0]
    return core.run_from_row(row, (await _execute(conn, core.cancel_record_statement(run_id), run_id=run_id))[0])


async def get_run_async(conn: psycopg.AsyncConnection[Any], run: RunRef[Any]) -> RunState[Any]:
    """:func:`pgflow_cli.client.get_run` on an asyncio connection."""
    run_id = core.run_id_of(run)
    rows = await _execute(conn, core.get_statement(run_id), run_id=run_id)
    return core.state_from_document(rows[0][0])


class _AsyncWaiter:
    """One task and one connection awaiting every run of an :class:`AsyncClient` (see the sync
    client's waiter: the same book, the same backoff, the same reconnection rule)."""

    def __init__(self, target: db.Target, policy: PollPolicy, connect_timeout: int, application_name: str) -> None:
        self._target = target
        self._connect_timeout = connect_timeout
        self._application_name = application_name
        self._book = WaitBook(policy)
        self._futures: dict[str, list[asyncio.Future[RunOutcome[Any]]]] = {}
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None

    @property
    def stats(self) -> core.WaitStats:
        return self._book.stats

    def register(self, run_id: str) -> asyncio.Future[RunOutcome[Any]]:
        if self._closing.is_set():
            raise RuntimeError("the client is closed")
        future: asyncio.Future[RunOutcome[Any]] = asyncio.get_running_loop().create_future()
        self._book.add(run_id, time.monotonic())
        self._futures.setdefault(run_id, []).append(future)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop(), name="pgflow-client-wait")
        self._wake.set()
        return future

    def unregister(self, run_id: str, future: asyncio.Future[RunOutcome[Any]]) -> None:
        futures = self._futures.get(run_id, [])
        if future in futures:
            futures.remove(future)
            self._book.discard(run_id)
            if not futures:
                self._futures.pop(run_id, None)

    def progress(self, run_id: str) -> RunProgress | None:
        return self._book.progress(run_id)

    async def close(self) -> None:
        self._closing.set()
        for run_id in self._book.fail_all():
            self._settle(run_id, RuntimeError("the client was closed while waiting"))
        self._wake.set()
        if self._task is not None:
            await self._task
        if self._conn is not None:
            await self._conn.close()

    def _settle(self, run_id: str, result: RunOutcome[Any] | BaseException) -> None:
        for future in self._futures.pop(run_id, []):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    async def _loop(self) -> None:
        while not self._closing.is_set():
            wake = self._book.next_wake()
            if wake is None:
                return
            now = time.monotonic()
            if wake > now:
                self._wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wake - now)
                continue
            run_ids = self._book.due(now)
            try:
                rows = await self._poll(run_ids)
            except Exception as exc:
                for run_id in run_ids if not isinstance(exc, ConnectionFailed) else self._book.fail_all():
                    self._book.discard(run_id)
                    self._settle(run_id, exc)
                continue
            ended = self._book.record(run_ids, rows, time.monotonic(), dt.datetime.now(dt.timezone.utc))
            for run_id, result in ended.items():
                self._settle(run_id, result)

    async def _poll(self, run_ids: Sequence[str]) -> list[dict[str, Any]]:
        statement = core.poll_statement(run_ids)
        reconnect: core.Reconnect | None = None
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = await db.connect_async(self._target, application_name=self._application_name,
                                                        connect_timeout=self._connect_timeout)
                    self._conn.prepare_threshold = None
                async with self._conn.cursor(row_factory=dict_row) as cur:
                    await cur.execute(statement.sql, statement.params)
                    rows = await cur.fetchall()
                if reconnect is not None:
                    self._book.stats.reconnects += 1
                return rows
            except (psycopg.OperationalError, ConnectionFailed) as exc:
                if self._conn is not None:
                    await self._conn.close()
                    self._conn = None
                reconnect = reconnect or core.Reconnect(self._book.policy, time.monotonic())
                delay = reconnect.next_delay(time.monotonic())
                if delay is None:
                    raise reconnect.gave_up(self._target.describe(), exc) from None
                try:
                    await asyncio.wait_for(self._closing.wait(), delay)
                    raise ConnectionFailed("the client was closed while reconnecting") from None
                except asyncio.TimeoutError:
                    pass


class AsyncClient:
    """:class:`pgflow_cli.client.Client` for asyncio: the same methods, awaited.

    Every wait of one client shares one background task and one connection, so
    ``await asyncio.gather(*(client.wait(run) for run in runs))`` over 1,000 runs sends about as many
    statements as one wait. Use a client from one event loop.

    Example::

        async with AsyncClient(dsn) as client:
            run = await client.start(greet, {"first": "Ada", "last": "Lovelace"})
            output = await client.wait(run, timeout=30)
    """

    def __init__(self, conninfo: str | db.Target | None = None, *, connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
                 poll: PollPolicy | None = None, application_name: str = "pgflow-client") -> None:
        self.target = conninfo if isinstance(conninfo, db.Target) else db.resolve_target(conninfo)
        self.poll = poll or PollPolicy()
        self._connect_timeout = connect_timeout
        self._application_name = application_name
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._conn_lock: asyncio.Lock | None = None
        self._waiter: _AsyncWaiter | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections; waits still in progress fail."""
        if self._waiter is not None:
            await self._waiter.close()
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    @property
    def stats(self) -> core.WaitStats:
        """What awaiting has cost so far (poll statements, run ids read, reconnections)."""
        return self._get_waiter().stats

    def _get_waiter(self) -> _AsyncWaiter:
        if self._waiter is None:
            self._waiter = _AsyncWaiter(self.target, self.poll, self._connect_timeout, self._application_name)
        return self._waiter

    async def _connection(self, conn: psycopg.AsyncConnection[Any] | None) -> psycopg.AsyncConnection[Any]:
        if conn is not None:
            return conn
        if self._conn_lock is None:
            self._conn_lock = asyncio.Lock()
        async with self._conn_lock:
            if self._conn is None or self._conn.closed:
                self._conn = await db.connect_async(self.target, application_name=self._application_name,
                                                    connect_timeout=self._connect_timeout)
                self._conn.prepare_threshold = None
            return self._conn

    @overload
    async def start(self, flow: str, input: Any, *, run_id: Any = None,
                    conn: psycopg.AsyncConnection[Any] | None = None) -> Run[str]: ...
    @overload
    async def start(self, flow: FlowRef[S], input: Any, *, run_id: Any = None,
                    conn: psycopg.AsyncConnection[Any] | None = None) -> Run[S]: ...
    async def start(self, flow: FlowRef[Any], input: Any, *, run_id: Any = None,
                    conn: psycopg.AsyncConnection[Any] | None = None) -> Run[Any]:
        """Start one run (:func:`start_run_async`)."""
        return await start_run_async(await self._connection(conn), flow, input, run_id=run_id)

    @overload
    async def start_many(self, flow: str, inputs: Any, *, conn: psycopg.AsyncConnection[Any] | None = None
                         ) -> list[Run[str]]: ...
    @overload
    async def start_many(self, flow: FlowRef[S], inputs: Any, *, conn: psycopg.AsyncConnection[Any] | None = None
                         ) -> list[Run[S]]: ...
    async def start_many(self, flow: FlowRef[Any], inputs: Any, *, conn: psycopg.AsyncConnection[Any] | None = None
                         ) -> list[Run[Any]]:
        """Start one run per input in one statement (:func:`start_runs_async`)."""
        return await start_runs_async(await self._connection(conn), flow, inputs)

    async def retry(self, run: RunRef[Any], *, conn: psycopg.AsyncConnection[Any] | None = None) -> Run[Any]:
        """Retry a failed run as a fresh run: :func:`retry_run_async`."""
        return await retry_run_async(await self._connection(conn), run)

    async def resume(self, run: RunRef[Any], *, conn: psycopg.AsyncConnection[Any] | None = None) -> Run[Any]:
        """Resume a failed run, reusing every task it completed: :func:`resume_run_async`."""
        return await resume_run_async(await self._connection(conn), run)

    async def cancel(self, run: RunRef[Any], reason: str | None = None, *,
                     conn: psycopg.AsyncConnection[Any] | None = None) -> Run[Any]:
        """Cancel a started run: :func:`cancel_run_async`."""
        return await cancel_run_async(await self._connection(conn), run, reason)

    async def get(self, run: RunRef[S], *, conn: psycopg.AsyncConnection[Any] | None = None) -> RunState[S]:
        """A run with its steps (:func:`get_run_async`)."""
        return await get_run_async(await self._connection(conn), run)

    async def outcome(self, run: RunRef[S], *, timeout: float | None = None,
                      on_progress: ProgressCallback | None = None, progress_every: float = 5.0) -> RunOutcome[S]:
        """Await the end of a run: :meth:`pgflow_cli.client.Client.outcome`."""
        run_id = core.run_id_of(run)
        waiter = self._get_waiter()
        future = waiter.register(run_id)
        clock = core.WaitClock(timeout, progress_every if on_progress is not None else None)
        try:
            while not (await asyncio.wait({future}, timeout=clock.pause()))[0]:
                progress = waiter.progress(run_id)
                if clock.expired():
                    raise WaitTimeout(run_id, timeout, progress)
                if on_progress is not None and progress is not None:
                    on_progress(progress)
            return future.result()
        finally:
            if not future.done():
                waiter.unregister(run_id, future)
                future.cancel()

    async def wait(self, run: RunRef[S], *, timeout: float | None = None, on_progress: ProgressCallback | None = None,
                   progress_every: float = 5.0) -> dict[S, Any]:
        """Await a run's output: :meth:`pgflow_cli.client.Client.wait` (RunFailed for a failed run)."""
        outcome = await self.outcome(run, timeout=timeout, on_progress=on_progress, progress_every=progress_every)
        return outcome.result()

    async def as_completed(self, runs: Sequence[RunRef[S]], *, timeout: float | None = None
                           ) -> AsyncIterator[RunOutcome[S]]:
        """Yield each run's outcome as it ends (:meth:`pgflow_cli.client.Client.as_completed`). Waits not
        consumed when the iteration stops early go on until their timeout or :meth:`close`."""
        for next_outcome in asyncio.as_completed([self.outcome(run, timeout=timeout) for run in runs]):
            yield await next_outcome

    async def wait_all(self, runs: Sequence[RunRef[S]], *, timeout: float | None = None) -> list[RunOutcome[S]]:
        """Await many runs at once; outcomes in the given order (:meth:`pgflow_cli.client.Client.wait_all`)."""
        return list(await asyncio.gather(*(self.outcome(run, timeout=timeout) for run in runs)))

    @overload
    async def run(self, flow: str, input: Any, *, timeout: float | None = None) -> dict[str, Any]: ...
    @overload
    async def run(self, flow: FlowRef[S], input: Any, *, timeout: float | None = None) -> dict[S, Any]: ...
    async def run(self, flow: FlowRef[Any], input: Any, *, timeout: float | None = None) -> dict[Any, Any]:
        """Start a run and await its output."""
        return await self.wait(await self.start(flow, input), timeout=timeout)

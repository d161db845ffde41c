"""Awaiting runs: what the database pays for the run client's waits, next to a hand-written poll loop.

N runs of a flow with one manual step are started and awaited in one process; a releaser completes
their manual tasks in 20 equal batches spread over ``SPREAD`` seconds, so the runs end one batch
at a time, as runs of a live system end at different moments. Measured on a server of its own with
``pg_stat_statements`` (``track = top``), between a reset and the last run's end:

* **poll loop**: one coroutine per run reads ``SELECT status FROM pgflow.runs WHERE run_id = $1``
  every 0.25 s until the run ended (what an application writes without the client), over a pool of
  10 connections;
* **client**: :class:`pgflow_cli.client.AsyncClient` with its default policy (every awaited run
  looked at 0.05 s after its wait began, each interval 1.5 times the one before, at most 2 s; all
  runs due together read by one statement).

Per waited run: statements, server time (``total_exec_time`` of the waiting statements, µs) and how
long after its release the waiter learned that the run ended (median and maximum, s): the latency a
run-end notification could remove. ``ending_us_per_run`` in the details is the server time the
releaser's ``complete_manual_task`` calls took per run in the same window: what ending a run costs,
to put the waiting cost in scale. ``looks_per_run`` in the client's details is how many times each
run was read: the statements an ungrouped backoff (one statement per look) would send.

The details also give the looks of the default policy for one run awaited alone for 1, 10, 60 and
600 s (from :class:`pgflow_cli.client.core.WaitBook`, no database).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import statistics
import time
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from bench.core import Context, Result, statements_server
from pgflow_cli.client import AsyncClient, PollPolicy, start_runs
from pgflow_cli.client.core import WaitBook
from pgflow_cli.worker import Flow
from pgflow_cli.worker.protocol import LATEST

SPREAD = 6.0
"""Seconds over which the runs end."""
BATCHES = 20
LOOP_INTERVAL = 0.25
"""The hand-written loop's pause between two reads of one run."""
POOL = 10

FLOW = Flow("benchWait").step("approve", manual=True)
WAITING = {
    "client": "%FROM pgflow.runs AS r%WHERE r.run_id = ANY%",
    "loop": "SELECT status FROM pgflow.runs WHERE run_id = %",
}
ENDING = "%pgflow.complete_manual_task%"
"""The releaser's statements: what ending the runs cost the server in the same window (for scale)."""
COST = ("SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(total_exec_time), 0) FROM pg_stat_statements "
        "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query LIKE %s")


async def _release(conninfo: str, run_ids: list[str], released: dict[str, float]) -> None:
    """Complete the runs' manual tasks, one batch every SPREAD / BATCHES seconds."""
    size = -(-len(run_ids) // BATCHES)
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        for first in range(0, len(run_ids), size):
            await asyncio.sleep(SPREAD / BATCHES)
            batch = run_ids[first:first + size]
            await conn.execute("SELECT count(*) FROM unnest(%s::uuid[]) AS r (run_id), "
                               "LATERAL pgflow.complete_manual_task(r.run_id, 'approve', 0, 'true'::jsonb)", (batch,))
            now = time.monotonic()
            released.update(dict.fromkeys(batch, now))


async def _client_waits(conninfo: str, run_ids: list[str], noticed: dict[str, float]) -> dict[str, Any]:
    async with AsyncClient(conninfo, application_name="bench-client") as pgflow:
        async def one(run_id: str) -> None:
            await pgflow.outcome(run_id, timeout=120)
            noticed[run_id] = time.monotonic()

        await asyncio.gather(*(one(run_id) for run_id in run_ids))
        return {"client_polls": pgflow.stats.polls, "looks_per_run": round(pgflow.stats.runs_read / len(run_ids), 2)}


async def _loop_waits(conninfo: str, run_ids: list[str], noticed: dict[str, float]) -> dict[str, Any]:
    async with AsyncConnectionPool(conninfo, min_size=POOL, max_size=POOL, kwargs={"autocommit": True}) as pool:
        async def one(run_id: str) -> None:
            while True:
                async with pool.connection() as conn:
                    row = await (await conn.execute("SELECT status FROM pgflow.runs WHERE run_id = %s",
                                                    (run_id,))).fetchone()
                if row is not None and row[0] != "started":
                    noticed[run_id] = time.monotonic()
                    return
                await asyncio.sleep(LOOP_INTERVAL)

        await asyncio.gather(*(one(run_id) for run_id in run_ids))
    return {}


def sample(ctx: Context, runs: int, how: str) -> tuple[float, float, float, float, dict[str, Any]]:
    """One measurement: (statements, server µs, median delay s, max delay s) per waited run, details."""
    with ctx.database(f"wait_{how}") as conninfo, psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        LATEST().compile(conn, FLOW.slug, FLOW.shape(), None)
        run_ids = [run.run_id for run in start_runs(conn, FLOW, [{} for _ in range(runs)])]
        conn.execute("ANALYZE")
        conn.execute("SELECT pg_stat_statements_reset()")
        released: dict[str, float] = {}
        noticed: dict[str, float] = {}

        async def both() -> dict[str, Any]:
            waits = _client_waits if how == "client" else _loop_waits
            details, _ = await asyncio.gather(waits(conninfo, run_ids, noticed), _release(conninfo, run_ids, released))
            return details

        details = asyncio.run(both())
        calls, exec_ms = conn.execute(COST, (WAITING[how],)).fetchone()
        _, ending_ms = conn.execute(COST, (ENDING,)).fetchone()
    delays = [noticed[run_id] - released[run_id] for run_id in run_ids]
    return (calls / runs, 1000 * float(exec_ms) / runs, statistics.median(delays), max(delays),
            {**details, "statements": calls, "ending_us_per_run": round(1000 * float(ending_ms) / runs, 1)})


def alone(seconds: float, policy: PollPolicy) -> int:
    """Looks the policy takes at one run awaited alone until it ends after ``seconds``."""
    book = WaitBook(policy)
    book.add("run", 0.0)
    wall = dt.datetime.now(dt.timezone.utc)
    while True:
        now = book.next_wake()
        assert now is not None
        due = book.due(now)
        status = "completed" if now >= seconds else "started"
        row = {"run_id": "run", "status": status, "remaining_steps": 1, "flow_slug": "f", "output": {},
               "failures": None, "started_at": wall, "completed_at": wall, "failed_at": None}
        if book.record(due, [row], now, wall):
            return book.stats.polls


def run(ctx: Context) -> list[Result]:
    runs = ctx.size(500)
    collected: dict[str, dict[str, list[float]]] = {how: {"statements": [], "server": [], "median": [], "max": []}
                                                    for how in ("loop", "client")}
    details: dict[str, dict[str, Any]] = {}
    with statements_server(ctx, "run_wait") as own:
        for i in range(ctx.repeat):
            for how in ("loop", "client"):
                statements, server_us, median, worst, extra = sample(own, runs, how)
                for key, value in zip(("statements", "server", "median", "max"),
                                      (1000 * statements, server_us, median, worst), strict=True):
                    collected[how][key].append(value)
                details[how] = extra
                ctx.log(f"run_wait {i + 1}/{ctx.repeat} {how}: {statements:.3f} statements and {server_us:.0f} us of "
                        f"server time per waited run (ending one: {extra['ending_us_per_run']:.0f} us); noticed "
                        f"{median:.2f} s (median), {worst:.2f} s (max) after the end")
    policy = PollPolicy()
    common = {"lower_is_better": True, "runs": runs, "spread_seconds": SPREAD, "track": "top",
              "alone_looks": {f"{s} s": alone(s, policy) for s in (1, 10, 60, 600)}}
    loop_name = f"poll loop per run (every {LOOP_INTERVAL} s)"
    client_name = "run client (shared looks, backoff 0.05 s x1.5 to 2 s)"
    results = []
    for key, unit, what in (("statements", "stmts/1000 runs", "statements per 1,000 waited runs"),
                            ("server", "us/run", "server time per waited run"),
                            ("median", "s", "run end noticed after (median)"),
                            ("max", "s", "run end noticed after (max)")):
        results.append(Result(f"{loop_name}: {what}", unit, collected["loop"][key], work=runs,
                              details={**common, **details["loop"]}))
        results.append(Result(f"{client_name}: {what}", unit, collected["client"][key], work=runs,
                              baseline=f"{loop_name}: {what}", details={**common, **details["client"]}))
    return results

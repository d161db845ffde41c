"""A thin test driver for the pgflow runtime: real SQL calls and real PGMQ reads, nothing mocked.

Tests act like a worker would: ``pgmq.read`` to get message ids, claim, then
``pgflow.complete_task`` / ``pgflow.fail_task`` to report. The driver speaks the worker
protocol of the schema level it was built for:

* ``baseline`` (migrations 0001-0002, protocol 1): a flow's queue is named like the flow;
  claims go through ``pgflow.start_tasks(flow_slug, msg_ids, worker_id)``; one worker row
  (function ``test-worker``, no route) claims for every flow;
* ``upgraded`` (every migration, protocol 2): a plain flow's queue is ``lower(flow_slug)``;
  claims go through ``pgflow.claim_tasks(queue_name, msg_ids, worker_id, flow_slug)``, which
  returns one classified row per message. Only ``claimed`` rows are tasks; they are returned
  in the baseline's ``step_task_record`` shape so the same test bodies run on both levels.
  Each flow gets its own worker row registered with the flow's real route, as a protocol-2
  worker registers. A ``fatal`` outcome (a claim that paused the worker function) is never
  swallowed: :meth:`Runtime.claim` raises ``AssertionError`` with the rows.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgflow_cli import installer, naming
from tests.support.sqlrows import RowQueries

LEVELS = ("baseline", "upgraded")
"""Schema levels the runtime suite runs on (pytest ids)."""

TASK_FIELDS = ("flow_slug", "run_id", "step_slug", "input", "msg_id", "task_index", "flow_input")
"""Columns of ``pgflow.step_task_record``, the shape every claimed task has in the tests."""


class Runtime(RowQueries):
    """Helpers around one autocommit connection to a test database (plain SQL: ``rows``, ``one``,
    ``val`` of :class:`~tests.support.sqlrows.RowQueries`)."""

    def __init__(self, conn: psycopg.Connection, level: str = "baseline") -> None:
        if level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, not {level!r}")
        self.conn = conn
        self.conn.row_factory = dict_row
        self.level = level
        self.require_live_messages = True
        self._worker: uuid.UUID | None = None
        self._flow_workers: dict[str, uuid.UUID] = {}
        self.last_outcomes: list[dict] = []

    @property
    def upgraded(self) -> bool:
        """True on the queue-identity schema (protocol 2)."""
        return self.level == "upgraded"

    def queue(self, slug: str) -> str:
        """The queue a plain flow's tasks live in: the slug itself (baseline) or lower(slug)."""
        if not self.upgraded:
            return slug
        return naming.normalized_slug(slug)

    @property
    def prune_file(self) -> str:
        """The optional pruning file that matches this schema level (sql/optional)."""
        return "optional/prune.sql" if self.upgraded else "optional/prune_baseline.sql"

    # -- definitions ---------------------------------------------------------------------
    def flow(self, slug: str, steps: list[dict] | None = None, **options: Any) -> None:
        """create_flow + add_step for each ``{"slug", "deps", ...add_step named args}``."""
        self.conn.execute(
            "SELECT pgflow.create_flow(%s, max_attempts => %s, base_delay => %s, timeout => %s)",
            (slug, options.get("max_attempts"), options.get("base_delay"), options.get("timeout")),
        )
        for step in steps or []:
            args = {k: v for k, v in step.items() if k not in ("slug", "deps")}
            names = "".join(f", {k} => %({k})s" for k in args)
            params = {k: (Jsonb(v) if k.endswith("_pattern") and v is not None else v) for k, v in args.items()}
            params.update(flow=slug, step=step["slug"], deps=step.get("deps", []))
            self.conn.execute(
                f"SELECT pgflow.add_step(%(flow)s, %(step)s, %(deps)s::text[]{names})", params
            )

    # -- runs ----------------------------------------------------------------------------
    def start(self, slug: str, input: Any) -> uuid.UUID:
        row = self.one("SELECT * FROM pgflow.start_flow(%s, %s)", (slug, Jsonb(input)))
        return row["run_id"]

    def run(self, run_id: uuid.UUID) -> dict:
        """The run's row, and where the schema keeps them (migration 0003) its restart and cancel
        records beside it (``restart_of_run_id``, ``restart_kind``, ``cancelled_at``,
        ``cancel_reason``, ``cancelled_by``: None where there is none)."""
        if not self.one("SELECT to_regclass('pgflow.run_cancellations') IS NOT NULL AS present")["present"]:
            return self.one("SELECT * FROM pgflow.runs WHERE run_id = %s", (run_id,))
        return self.one(
            "SELECT r.*, rr.restart_of_run_id, rr.restart_kind, c.cancelled_at, c.reason AS cancel_reason, "
            "c.cancelled_by FROM pgflow.runs AS r LEFT JOIN pgflow.run_restarts AS rr ON rr.run_id = r.run_id "
            "LEFT JOIN pgflow.run_cancellations AS c ON c.run_id = r.run_id WHERE r.run_id = %s", (run_id,))

    def steps(self, run_id: uuid.UUID) -> dict[str, dict]:
        return {
            r["step_slug"]: r
            for r in self.rows("SELECT * FROM pgflow.step_states WHERE run_id = %s", (run_id,))
        }

    def tasks(self, run_id: uuid.UUID, step: str | None = None) -> list[dict]:
        return self.rows(
            "SELECT * FROM pgflow.step_tasks WHERE run_id = %s AND (%s::text IS NULL OR step_slug = %s) "
            "ORDER BY step_slug, task_index",
            (run_id, step, step),
        )

    def task(self, run_id: uuid.UUID, step: str, index: int = 0) -> dict:
        return self.one(
            "SELECT * FROM pgflow.step_tasks WHERE run_id = %s AND step_slug = %s AND task_index = %s",
            (run_id, step, index),
        )

    def statuses(self, run_id: uuid.UUID) -> dict[str, str]:
        return {k: v["status"] for k, v in self.steps(run_id).items()}

    def compile(self, slug: str, shape: dict) -> dict:
        """Startup compilation as this level's worker calls it.

        Baseline: ``ensure_flow_compiled(flow_slug, shape)``. Upgraded: the protocol-2 form
        with ``queue_mode => 'flow'`` and the route map a plain-flow worker derives
        (every step on ``lower(flow_slug)``).
        """
        if not self.upgraded:
            return self.val("SELECT pgflow.ensure_flow_compiled(%s, %s)", (slug, Jsonb(shape)))
        steps = shape.get("steps") if isinstance(shape, dict) else None
        route_map = None
        if isinstance(steps, list):
            route_map = Jsonb([{"stepSlug": s.get("slug"), "queueName": self.queue(slug)} for s in steps])
        return self.val(
            "SELECT pgflow.ensure_flow_compiled(%s, %s, protocol_version => 2, queue_mode => 'flow', route_map => %s)",
            (slug, Jsonb(shape), route_map),
        )

    # -- workers -------------------------------------------------------------------------
    @property
    def worker(self) -> uuid.UUID:
        """A registered worker without a route (registered on first use; valid on both levels)."""
        if self._worker is None:
            self._worker = uuid.uuid4()
            self.conn.execute(
                "SELECT pgflow.register_worker(%s, 'test-worker', 'any', NULL)", (self._worker,)
            )
        return self._worker

    def worker_for(self, slug: str) -> uuid.UUID:
        """The worker that claims the tasks of flow ``slug``.

        Baseline: the one route-less :attr:`worker`. Upgraded: a worker registered with the
        flow's real route ``(lower(flow_slug), flow_slug)``, which 0003 validates.
        """
        if not self.upgraded:
            return self.worker
        if slug not in self._flow_workers:
            wid = uuid.uuid4()
            self.conn.execute(
                "SELECT pgflow.register_worker(%s, 'test-worker', %s, %s)", (wid, self.queue(slug), slug)
            )
            self._flow_workers[slug] = wid
        return self._flow_workers[slug]

    # -- queues --------------------------------------------------------------------------
    def qtable(self, queue: str, prefix: str = "q") -> sql.Composable:
        name = self.val("SELECT pgmq.format_table_name(%s, %s)", (queue, prefix))
        return sql.SQL("pgmq.{}").format(sql.Identifier(name))

    def read(self, queue: str, qty: int = 100, vt: int = 30) -> list[dict]:
        return self.rows("SELECT * FROM pgmq.read(%s, %s, %s)", (queue, vt, qty))

    def messages(self, queue: str) -> list[dict]:
        """Every message in the queue table, visible or not."""
        return self.rows(sql.SQL("SELECT * FROM {} ORDER BY msg_id").format(self.qtable(queue)))

    def archived(self, queue: str) -> list[dict]:
        return self.rows(sql.SQL("SELECT * FROM {} ORDER BY msg_id").format(self.qtable(queue, "a")))

    def vt_in(self, queue: str, msg_id: int) -> float:
        """Seconds from now until the message becomes visible (negative: already visible)."""
        return float(
            self.val(
                sql.SQL("SELECT extract(epoch FROM vt - clock_timestamp()) FROM {} WHERE msg_id = %s").format(
                    self.qtable(queue)
                ),
                (msg_id,),
            )
        )

    def make_visible(self, queue: str) -> None:
        """Test shortcut instead of sleeping: every message of the queue becomes visible now."""
        self.conn.execute(sql.SQL("UPDATE {} SET vt = clock_timestamp()").format(self.qtable(queue)))

    # -- worker protocol -----------------------------------------------------------------
    def claim_outcomes(
        self, slug: str, msg_ids: list[int], worker: uuid.UUID | None = None, *, queue: str | None = None,
        conn: psycopg.Connection | None = None,
    ) -> list[dict]:
        """Upgraded only: every row ``pgflow.claim_tasks`` returns, in message-id order."""
        assert self.upgraded, "claim_tasks exists from protocol 2 on"
        cur = (conn or self.conn).cursor(row_factory=dict_row)
        return cur.execute(
            "SELECT * FROM pgflow.claim_tasks(%s, %s::bigint[], %s, %s)",
            (queue if queue is not None else self.queue(slug), msg_ids,
             worker if worker is not None else self.worker_for(slug), slug),
        ).fetchall()

    def claim(self, slug: str, msg_ids: list[int]) -> list[dict]:
        """Claim the tasks behind ``msg_ids`` of flow ``slug``; returns the claimed tasks.

        Rows come in the order of ``msg_ids`` (as start_tasks returns them) with the
        :data:`TASK_FIELDS` keys. Upgraded: the full outcome list is kept in
        :attr:`last_outcomes`; duplicates, archived and missing messages are not tasks; a
        fatal claim raises ``AssertionError``.
        """
        if not self.upgraded:
            return self.rows("SELECT * FROM pgflow.start_tasks(%s, %s, %s)", (slug, msg_ids, self.worker_for(slug)))
        rows = self.claim_outcomes(slug, msg_ids)
        self.last_outcomes = rows
        fatal = [r for r in rows if r["outcome"] in ("fatal", "released")]
        assert not fatal, f"claim_tasks refused the batch of flow {slug}: {fatal}"
        position = {m: i for i, m in reversed(list(enumerate(msg_ids)))}
        claimed = sorted(
            (r for r in rows if r["outcome"] == "claimed"),
            key=lambda r: (position.get(r["message_id"], len(position)), str(r["run_id"]), r["step_slug"], r["task_index"]),
        )
        return [as_task(r) for r in claimed]

    def poll(self, slug: str, qty: int = 100) -> list[dict]:
        """Read every visible message of the flow's queue and claim them."""
        msgs = self.read(self.queue(slug), qty)
        return self.claim(slug, [m["msg_id"] for m in msgs]) if msgs else []

    def complete(self, run_id: uuid.UUID, step: str, index: int, output: Any) -> dict | None:
        return self.one("SELECT * FROM pgflow.complete_task(%s, %s, %s, %s)", (run_id, step, index, Jsonb(output)))

    def fail(self, run_id: uuid.UUID, step: str, index: int, error: str = "boom") -> dict | None:
        return self.one("SELECT * FROM pgflow.fail_task(%s, %s, %s, %s)", (run_id, step, index, error))

    def drive(self, slug: str, handler: Callable[[dict], Any], *, max_rounds: int = 50) -> list[dict]:
        """Poll, claim and handle until the queue has nothing visible; returns the handled tasks.

        ``handler(task)`` returns the output, or raises to report a failure (its message
        becomes the error). Retries become visible immediately (tests use base_delay 0).
        """
        seen: list[dict] = []
        for _ in range(max_rounds):
            claimed = self.poll(slug)
            if not claimed:
                return seen
            for task in claimed:
                seen.append(task)
                try:
                    output = handler(task)
                except Exception as exc:  # the handler's failure is the task's failure
                    self.fail(task["run_id"], task["step_slug"], task["task_index"], str(exc))
                else:
                    self.complete(task["run_id"], task["step_slug"], task["task_index"], output)
        raise AssertionError(f"flow {slug} still had work after {max_rounds} rounds")


def install_all(conninfo: str) -> None:
    """Build the upgraded schema level: PGMQ and every migration (the top-level ``db`` template)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        installer.install(conn, target=None)


def as_task(row: dict) -> dict:
    """A ``claimed`` row of claim_tasks in the step_task_record shape (:data:`TASK_FIELDS`)."""
    assert row["outcome"] == "claimed", row
    return {
        "flow_slug": row["flow_slug"],
        "run_id": row["run_id"],
        "step_slug": row["step_slug"],
        "input": row["input"],
        "msg_id": row["message_id"],
        "task_index": row["task_index"],
        "flow_input": row["flow_input"],
    }


def wait_until_blocked(observer: psycopg.Connection, pid: int, *, deadline: float = 15.0) -> list[int]:
    """Wait until backend ``pid`` waits for a lock another backend holds; return the blockers.

    Polls ``pg_blocking_pids`` (no fixed sleep decides anything): a backend that never blocks
    fails the test after ``deadline`` seconds, one that blocks returns as soon as it does.
    """
    end = time.monotonic() + deadline
    while True:
        row = observer.execute("SELECT pg_blocking_pids(%s)", (pid,)).fetchone()
        blockers = list(row[0] if not isinstance(row, dict) else next(iter(row.values())))
        if blockers:
            return blockers
        if time.monotonic() > end:
            raise AssertionError(f"backend {pid} never waited for a lock")
        time.sleep(0.01)


class _SqlstateRaises:
    def __init__(self, sqlstate: str, match: str | None) -> None:
        self.sqlstate = sqlstate
        self.match = match
        self.error: psycopg.Error | None = None

    def __enter__(self) -> _SqlstateRaises:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        import re

        if exc is None:
            raise AssertionError(f"expected SQLSTATE {self.sqlstate}, nothing was raised")
        if not isinstance(exc, psycopg.Error):
            return False
        assert exc.sqlstate == self.sqlstate, f"expected SQLSTATE {self.sqlstate}, got {exc.sqlstate}: {exc}"
        if self.match:
            assert re.search(self.match, str(exc)), f"{self.match!r} not in {exc}"
        self.error = exc
        return True


def raises_sqlstate(sqlstate: str, match: str | None = None) -> _SqlstateRaises:
    """Context manager: the block must raise a database error with this SQLSTATE (and text)."""
    return _SqlstateRaises(sqlstate, match)


def checked_runtime(database: Any, level: str) -> Iterator[Runtime]:
    """For a fixture, ``yield from checked_runtime(db, "upgraded")``: a :class:`Runtime` of ``level``
    on a new connection to ``database``; after the test the runtime invariants
    (tests/support/invariants.py) are checked on another one, honouring ``require_live_messages``."""
    from tests.support.invariants import assert_runtime_invariants

    runtime = Runtime(database.connect(), level=level)
    yield runtime
    assert_runtime_invariants(database.connect(), require_live_messages=runtime.require_live_messages)


def commit_when_blocked(observer: psycopg.Connection, holder: psycopg.Connection, waiter: psycopg.Connection,
                        call: Callable[[], Any]) -> dict[str, Any]:
    """Run ``call()`` (a statement on ``waiter``) in a thread; once ``waiter``'s backend waits for a
    lock (:func:`wait_until_blocked`, seen by ``observer``), commit ``holder`` and wait up to 30 s for
    the call to end.

    Returns:
        ``{"blockers": [pid, ...], "value": ...}``, or ``"error"`` instead of ``"value"`` when the
        call raised.
    """
    import threading

    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = call()
        except Exception as exc:  # the caller asserts on it
            result["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    result["blockers"] = wait_until_blocked(observer, waiter.info.backend_pid)
    holder.commit()
    thread.join(30)
    assert not thread.is_alive(), "the blocked call never finished"
    return result


def concurrently(database: Any, calls: list[Callable[[psycopg.Connection], Any]], *, deadline: float = 60.0) -> list[Any]:
    """Run each call on its own new connection to ``database``, all released at once (a barrier),
    and return each call's value in order. A call still running after ``deadline`` seconds (a
    deadlock the server did not break, a lost wake-up) fails the test; a call's error is raised."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    conns = [database.connect() for _ in calls]
    gate = threading.Barrier(len(calls))

    def run(conn: psycopg.Connection, call: Callable[[psycopg.Connection], Any]) -> Any:
        gate.wait(timeout=deadline)
        return call(conn)

    try:
        with ThreadPoolExecutor(len(calls)) as pool:
            futures = [pool.submit(run, c, f) for c, f in zip(conns, calls, strict=True)]
            return [f.result(timeout=deadline) for f in futures]
    finally:
        for conn in conns:
            conn.close()


_EVENT_TIMES = {"started_at", "completed_at", "failed_at", "skipped_at"}


def realtime_events(rt, runs: list[uuid.UUID]) -> list[tuple]:
    """The realtime events sent for ``runs`` (a fake ``realtime.send`` records them in ``realtime.sent``), in
    order: (index of the run in ``runs``, event, payload without run ids and times)."""
    order = {f"pgflow:run:{r}": i for i, r in enumerate(runs)}
    sent = rt.rows("SELECT topic, event, payload FROM realtime.sent ORDER BY id")
    return [(order[s["topic"]], s["event"],
             {k: v for k, v in s["payload"].items() if k not in _EVENT_TIMES | {"run_id", "flow_slug"}})
            for s in sent if s["topic"] in order]

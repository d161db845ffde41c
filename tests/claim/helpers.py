"""Helpers of the claim-protocol tests: real messages through PGMQ, real ``pgflow.claim_tasks``.

Nothing is mocked. A :class:`ClaimEnv` owns connections to one fresh database (migrations
0001-0003, protocol 2), records every notice each connection receives and every task each
claim returned as ``claimed`` (the claim ledger). After each test, :meth:`ClaimEnv.check`
verifies, on a separate connection:

* the runtime invariants (tests/support/invariants.py): no task lost, no message left behind
  for a finished task, bookkeeping intact;
* the claim ledger: every task's ``attempts_count`` equals the number of times a claim returned
  it as ``claimed``, so an attempt was consumed exactly by the claims that happened (none run
  twice, attempts unchanged where no claim happened);
* message conservation: in every PGMQ queue, every message id ever issued is either still in
  the queue or in its archive, exactly once (nothing deleted, nothing duplicated).

No assertion depends on how long anything took: visibility times are compared with the
database clock read before and after the call.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb


def nested_plans(conn: psycopg.Connection, statement: str, params: Any, *, analyze: bool = False) -> list[str]:
    """Every plan of ``statement``, its nested statements included, as auto_explain reports them.

    Args:
        conn: the session to run it in (auto_explain is loaded into it, and switched off after).
        statement: the SQL, with ``params`` (psycopg placeholders); its rows are fetched.
        analyze: also report actual rows, loops and times (``auto_explain.log_analyze``).

    Returns:
        One text per executed statement, in execution order (plan-shape assertions only, never times).
    """
    plans: list[str] = []

    def keep(diag: psycopg.errors.Diagnostic) -> None:
        if diag.message_primary and "plan:" in diag.message_primary:
            plans.append(diag.message_primary)

    conn.add_notice_handler(keep)
    conn.execute("LOAD 'auto_explain'")
    for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                    "auto_explain.log_level = notice", "client_min_messages = notice",
                    f"auto_explain.log_analyze = {'on' if analyze else 'off'}"):
        conn.execute(f"SET {setting}")
    try:
        conn.execute(statement, params).fetchall()
    finally:
        conn.execute("SET auto_explain.log_min_duration = -1")
        conn.remove_notice_handler(keep)
    assert plans, "auto_explain reported no plan"
    return plans


OUTCOMES = ("claimed", "duplicate", "archived_terminal", "archived_foreign", "missing", "fatal", "released")


@dataclass
class Notice:
    severity: str
    sqlstate: str | None
    message: str
    hint: str | None
    detail: str | None

    def text(self) -> str:
        return " ".join(part for part in (self.message, self.hint or "", self.detail or "") if part)


@dataclass
class Claim:
    """What one ``pgflow.claim_tasks`` call returned, with the notices it raised."""

    rows: list[dict]
    notices: list[Notice]
    before: Any  # database clock just before the call
    after: Any  # database clock just after the call

    @property
    def outcomes(self) -> dict[int, tuple[str, str | None]]:
        return {r["message_id"]: (r["outcome"], r["reason"]) for r in self.rows}

    def ids(self, outcome: str) -> list[int]:
        return sorted(r["message_id"] for r in self.rows if r["outcome"] == outcome)

    @property
    def claimed(self) -> list[dict]:
        return [r for r in self.rows if r["outcome"] == "claimed"]

    def warnings(self) -> list[Notice]:
        return [n for n in self.notices if n.severity == "WARNING"]


@dataclass
class Snapshot:
    """Everything a fatal claim must leave unchanged (besides the safety writes)."""

    tasks: list[dict]
    live: dict[str, dict[int, tuple]]  # queue -> msg_id -> (read_ct, enqueued_at, message text)
    archived: dict[str, list[int]]
    runs: list[dict]
    step_states: list[dict]


@dataclass
class ClaimEnv:
    db: Any
    conn: psycopg.Connection = field(init=False)
    ledger: Counter = field(default_factory=Counter)
    require_live_messages: bool = True
    _notices: dict[int, list[Notice]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.conn = self.connect()

    # -- connections and notices ---------------------------------------------------------------
    def connect(self) -> psycopg.Connection:
        """A new autocommit connection whose notices are recorded."""
        conn = self.db.connect()
        conn.row_factory = dict_row
        store: list[Notice] = []
        with self._lock:
            self._notices[id(conn)] = store

        def on_notice(diag: psycopg.errors.Diagnostic) -> None:
            store.append(Notice(diag.severity_nonlocalized or diag.severity or "", diag.sqlstate,
                                diag.message_primary or "", diag.message_hint, diag.message_detail))

        conn.add_notice_handler(on_notice)
        return conn

    def notices(self, conn: psycopg.Connection | None = None) -> list[Notice]:
        return self._notices[id(conn or self.conn)]

    # -- plain SQL ------------------------------------------------------------------------------
    def rows(self, query: Any, params: Any = None, conn: psycopg.Connection | None = None) -> list[dict]:
        return (conn or self.conn).execute(query, params).fetchall()

    def one(self, query: Any, params: Any = None, conn: psycopg.Connection | None = None) -> dict | None:
        return (conn or self.conn).execute(query, params).fetchone()

    def val(self, query: Any, params: Any = None, conn: psycopg.Connection | None = None) -> Any:
        row = (conn or self.conn).execute(query, params).fetchone()
        return None if row is None else next(iter(row.values()))

    def clock(self, conn: psycopg.Connection | None = None):
        return self.val("SELECT clock_timestamp() AS now", conn=conn)

    # -- definitions and runs -----------------------------------------------------------------
    def flow(self, slug: str, steps: list[dict], **options: Any) -> None:
        """``create_flow`` + ``add_step`` per ``{"slug", "deps", ...named add_step args}``."""
        self.conn.execute(
            "SELECT pgflow.create_flow(%s, max_attempts => %s, base_delay => %s, timeout => %s)",
            (slug, options.get("max_attempts"), options.get("base_delay", 0), options.get("timeout")),
        )
        for step in steps:
            args = {k: v for k, v in step.items() if k not in ("slug", "deps")}
            names = "".join(f", {k} => %({k})s" for k in args)
            params = dict(args, flow=slug, step=step["slug"], deps=step.get("deps", []))
            self.conn.execute(f"SELECT pgflow.add_step(%(flow)s, %(step)s, %(deps)s::text[]{names})", params)

    def start(self, slug: str, run_input: Any) -> uuid.UUID:
        return self.val("SELECT run_id FROM pgflow.start_flow(%s, %s)", (slug, Jsonb(run_input)))

    def task(self, run_id: uuid.UUID, step: str, index: int = 0) -> dict:
        return self.one("SELECT * FROM pgflow.step_tasks WHERE run_id = %s AND step_slug = %s AND task_index = %s",
                        (run_id, step, index))

    def tasks(self, run_id: uuid.UUID | None = None) -> list[dict]:
        return self.rows("SELECT * FROM pgflow.step_tasks WHERE %s::uuid IS NULL OR run_id = %s "
                         "ORDER BY run_id, step_slug, task_index", (run_id, run_id))

    def complete(self, run_id: uuid.UUID, step: str, index: int, output: Any) -> None:
        self.conn.execute("SELECT pgflow.complete_task(%s, %s, %s, %s)", (run_id, step, index, Jsonb(output)))

    def fail(self, run_id: uuid.UUID, step: str, index: int, error: str = "boom") -> None:
        self.conn.execute("SELECT pgflow.fail_task(%s, %s, %s, %s)", (run_id, step, index, error))

    # -- workers --------------------------------------------------------------------------------
    def worker(self, flow_slug: str | None, *, function: str | None = None, queue: str | None = None,
               step: str | None = None) -> uuid.UUID:
        """Register a worker the way a protocol-2 worker does; returns its id."""
        worker_id = uuid.uuid4()
        if queue is None:
            queue = flow_slug.lower() if flow_slug else "any"
        self.conn.execute("SELECT pgflow.register_worker(%s, %s, %s, %s, %s)",
                          (worker_id, function or f"{flow_slug}-worker", queue, flow_slug, step))
        return worker_id

    def worker_row(self, worker_id: uuid.UUID, conn: psycopg.Connection | None = None) -> dict:
        return self.one("SELECT * FROM pgflow.workers WHERE worker_id = %s", (worker_id,), conn=conn)

    def function_row(self, function: str, conn: psycopg.Connection | None = None) -> dict | None:
        return self.one("SELECT * FROM pgflow.worker_functions WHERE function_name = %s", (function,), conn=conn)

    # -- queues ----------------------------------------------------------------------------------
    def table(self, queue: str, prefix: str = "q") -> sql.Composable:
        name = self.val("SELECT pgmq.format_table_name(%s, %s)", (queue, prefix))
        return sql.SQL("pgmq.{}").format(sql.Identifier(name))

    def queues(self, conn: psycopg.Connection | None = None) -> list[str]:
        return [r["queue_name"] for r in self.rows("SELECT queue_name FROM pgmq.meta ORDER BY 1", conn=conn)]

    def send(self, queue: str, body: Any) -> int:
        """Send one message; ``body`` is JSON text (sent as is) or a Python value."""
        if isinstance(body, str):
            return self.val("SELECT * FROM pgmq.send(%s, %s::jsonb)", (queue, body))
        return self.val("SELECT * FROM pgmq.send(%s, %s)", (queue, Jsonb(body)))

    def read(self, queue: str, qty: int = 100, vt: int = 30) -> list[int]:
        return [r["msg_id"] for r in self.rows("SELECT msg_id FROM pgmq.read(%s, %s, %s) ORDER BY msg_id",
                                               (queue, vt, qty))]

    def message(self, queue: str, msg_id: int, conn: psycopg.Connection | None = None) -> dict | None:
        return self.one(sql.SQL("SELECT * FROM {} WHERE msg_id = %s").format(self.table(queue)), (msg_id,), conn=conn)

    def archived(self, queue: str, conn: psycopg.Connection | None = None) -> list[int]:
        return [r["msg_id"] for r in self.rows(sql.SQL("SELECT msg_id FROM {} ORDER BY msg_id").format(
            self.table(queue, "a")), conn=conn)]

    def live(self, queue: str, conn: psycopg.Connection | None = None) -> list[int]:
        return [r["msg_id"] for r in self.rows(sql.SQL("SELECT msg_id FROM {} ORDER BY msg_id").format(
            self.table(queue)), conn=conn)]

    def visible_now(self, queue: str, ids: list[int], conn: psycopg.Connection | None = None) -> dict[int, bool]:
        """For each id still in the queue: is it visible (vt <= now)?"""
        found = self.rows(sql.SQL("SELECT msg_id, vt <= clock_timestamp() AS visible FROM {} WHERE msg_id = ANY(%s)")
                          .format(self.table(queue)), (ids,), conn=conn)
        return {r["msg_id"]: r["visible"] for r in found}

    def make_visible(self, queue: str, ids: list[int] | None = None) -> None:
        """Test shortcut instead of waiting: the messages become visible now (an expired read)."""
        self.conn.execute(sql.SQL("UPDATE {} SET vt = clock_timestamp() WHERE %s::bigint[] IS NULL OR msg_id = ANY(%s)")
                          .format(self.table(queue)), (ids, ids))

    def restore(self, queue: str, ids: list[int]) -> None:
        """Move archived messages back into the queue, visible now: a late redelivery of work
        that already ended (what a crashed archiver or an operator replay leaves behind)."""
        with self.conn.transaction():
            moved = self.rows(sql.SQL(
                "INSERT INTO {q} (msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers) "
                "OVERRIDING SYSTEM VALUE "
                "SELECT msg_id, read_ct, enqueued_at, last_read_at, clock_timestamp(), message, headers "
                "FROM {a} WHERE msg_id = ANY(%s) RETURNING msg_id").format(q=self.table(queue), a=self.table(queue, "a")),
                (ids,))
            assert sorted(r["msg_id"] for r in moved) == sorted(ids), "restore: a message was not archived"
            self.conn.execute(sql.SQL("DELETE FROM {} WHERE msg_id = ANY(%s)").format(self.table(queue, "a")), (ids,))

    # -- the claim -------------------------------------------------------------------------------
    def claim(self, queue: str, ids: list[int], worker_id: uuid.UUID, flow_slug: str | None,
              step_slug: str | None = None, conn: psycopg.Connection | None = None) -> Claim:
        """Call ``pgflow.claim_tasks`` (one autocommit statement) and record what it claimed."""
        conn = conn or self.conn
        store = self.notices(conn)
        seen = len(store)
        before = self.clock(conn)
        rows = conn.execute(
            "SELECT * FROM pgflow.claim_tasks(%s, %s::bigint[], %s, %s, %s)",
            (queue, ids, worker_id, flow_slug, step_slug),
        ).fetchall()
        after = self.clock(conn)
        result = Claim(rows=rows, notices=list(store[seen:]), before=before, after=after)
        self.record(result)
        return result

    def record(self, result: Claim) -> None:
        self.record_rows(result.rows)

    def record_rows(self, rows: list[dict]) -> None:
        """Add claim rows obtained outside :meth:`claim` to the ledger."""
        with self._lock:
            for r in rows:
                if r["outcome"] == "claimed":
                    self.ledger[(r["run_id"], r["step_slug"], r["task_index"])] += 1
        for r in rows:
            assert r["outcome"] in OUTCOMES, r["outcome"]
            if r["outcome"] != "claimed":
                assert r["input"] is None and r["flow_input"] is None, "only claimed rows carry inputs"

    # -- snapshots --------------------------------------------------------------------------------
    def snapshot(self, conn: psycopg.Connection | None = None) -> Snapshot:
        live: dict[str, dict[int, tuple]] = {}
        archived: dict[str, list[int]] = {}
        for queue in self.queues(conn):
            live[queue] = {
                r["msg_id"]: (r["read_ct"], r["enqueued_at"], r["body"])
                for r in self.rows(sql.SQL("SELECT msg_id, read_ct, enqueued_at, md5(coalesce(message::text, '<null>')) "
                                           "AS body FROM {}").format(self.table(queue)), conn=conn)
            }
            archived[queue] = self.archived(queue, conn)
        return Snapshot(
            tasks=self.rows("SELECT * FROM pgflow.step_tasks ORDER BY run_id, step_slug, task_index", conn=conn),
            live=live,
            archived=archived,
            runs=self.rows("SELECT * FROM pgflow.runs ORDER BY run_id", conn=conn),
            step_states=self.rows("SELECT * FROM pgflow.step_states ORDER BY run_id, step_slug", conn=conn),
        )

    # -- after every test ------------------------------------------------------------------------
    def check(self) -> None:
        from tests.support.invariants import check_runtime_invariants

        conn = self.connect()
        problems = check_runtime_invariants(conn, require_live_messages=self.require_live_messages)
        for t in self.rows("SELECT run_id, step_slug, task_index, attempts_count FROM pgflow.step_tasks", conn=conn):
            claims = self.ledger.get((t["run_id"], t["step_slug"], t["task_index"]), 0)
            if t["attempts_count"] != claims:
                problems.append(f"task {t['step_slug']}[{t['task_index']}] of run {t['run_id']}: attempts_count "
                                f"{t['attempts_count']} but claimed {claims} time(s)")
        for queue in self.queues(conn):
            live = self.live(queue, conn)
            archived = self.archived(queue, conn)
            issued = self.val("SELECT coalesce(last_value, 0) FROM pg_sequences WHERE schemaname = 'pgmq' "
                              "AND sequencename = %s", (f"q_{queue.lower()}_msg_id_seq",), conn=conn) or 0
            if set(live) & set(archived):
                problems.append(f"queue {queue}: messages both live and archived: {sorted(set(live) & set(archived))}")
            if sorted(live + archived) != list(range(1, issued + 1)):
                lost = sorted(set(range(1, issued + 1)) - set(live) - set(archived))
                problems.append(f"queue {queue}: message ids lost (neither live nor archived): {lost}")
        assert not problems, "claim-test invariants violated:\n  " + "\n  ".join(problems)


def assert_no_body(texts: list[str], secrets: list[str]) -> None:
    """None of ``secrets`` (markers placed inside message bodies) appears in any text."""
    for text in texts:
        for secret in secrets:
            assert secret not in text, f"a message body leaked into {text[:200]!r}"


def assert_fatal(env: ClaimEnv, result: Claim, *, before: Snapshot, queue: str, batch: list[int],
                 fatal: dict[int, str], worker_id: uuid.UUID, function: str, secrets: list[str] = ()) -> None:
    """Every promise of the fatal path, checked from a second connection after the call returned.

    ``fatal`` maps the message ids expected to be judged fatal to their reason code; every other
    id of ``batch`` must come back ``released``.
    """
    expected = {m: ("fatal", fatal[m]) if m in fatal else ("released", "batch_released") for m in batch}
    assert result.outcomes == expected
    assert result.claimed == []

    other = env.connect()  # a second session sees only what was committed
    now = env.snapshot(other)
    # nothing claimed, no task (or run, or step state) changed, nothing archived
    assert now.tasks == before.tasks
    assert now.runs == before.runs
    assert now.step_states == before.step_states
    assert now.archived == before.archived
    assert now.live == before.live  # same messages, same read counts, same bodies
    # the whole batch is visible again
    present = [m for m in batch if m in before.live.get(queue, {})]
    if present:
        assert env.visible_now(queue, present, other) == {m: True for m in present}
    # the function is paused persistently, with a reason naming queue, messages and reasons
    fn = env.function_row(function, other)
    assert fn is not None and fn["enabled"] is False
    assert fn["paused_at"] is not None
    reason = fn["paused_reason"]
    assert f'queue "{queue}"' in reason
    for msg_id, code in fatal.items():
        assert f"message {msg_id} {code}" in reason
    # the worker is deprecated: its next heartbeat tells it to stop
    assert env.worker_row(worker_id, other)["deprecated_at"] is not None
    # exactly one warning, naming queue and ids, never a body
    warnings = result.warnings()
    assert len(warnings) == 1, [w.message for w in warnings]
    assert f'"{queue}"' in warnings[0].message
    for msg_id, code in fatal.items():
        assert f"message {msg_id} {code}" in warnings[0].message
    assert_no_body([reason] + [n.text() for n in result.notices], list(secrets))

"""A thin test driver for the pgflow runtime: real SQL calls and real PGMQ reads, nothing mocked.

Tests act like a worker would: ``pgmq.read`` to get message ids, ``pgflow.start_tasks`` to
claim, ``pgflow.complete_task`` / ``pgflow.fail_task`` to report.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb


class Runtime:
    """Helpers around one autocommit connection to a test database."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.conn.row_factory = dict_row
        self.require_live_messages = True
        self._worker: uuid.UUID | None = None

    # -- plain SQL ---------------------------------------------------------------------
    def rows(self, query: str, params: Any = None) -> list[dict]:
        return self.conn.execute(query, params).fetchall()

    def one(self, query: str, params: Any = None) -> dict | None:
        return self.conn.execute(query, params).fetchone()

    def val(self, query: str, params: Any = None) -> Any:
        row = self.conn.execute(query, params).fetchone()
        return None if row is None else next(iter(row.values()))

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
        return self.one("SELECT * FROM pgflow.runs WHERE run_id = %s", (run_id,))

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

    # -- workers -------------------------------------------------------------------------
    @property
    def worker(self) -> uuid.UUID:
        """A registered worker id (registered on first use)."""
        if self._worker is None:
            self._worker = uuid.uuid4()
            self.conn.execute(
                "SELECT pgflow.register_worker(%s, 'test-worker', 'any', NULL)", (self._worker,)
            )
        return self._worker

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
    def claim(self, slug: str, msg_ids: list[int]) -> list[dict]:
        return self.rows("SELECT * FROM pgflow.start_tasks(%s, %s, %s)", (slug, msg_ids, self.worker))

    def poll(self, slug: str, qty: int = 100) -> list[dict]:
        """Read every visible message of the flow's queue and claim them."""
        msgs = self.read(slug, qty)
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


class _SqlstateRaises:
    def __init__(self, sqlstate: str, match: str | None) -> None:
        self.sqlstate = sqlstate
        self.match = match
        self.error: psycopg.Error | None = None

    def __enter__(self) -> "_SqlstateRaises":
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

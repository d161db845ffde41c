"""Helpers of the reference-worker tests: invocation recording, waiting on real database state,
queue accounting over every PGMQ queue, and worker subprocesses.

Nothing here mocks the database: every check reads ``pgflow.*`` and ``pgmq.*`` tables of the
test's own database. Waits have generous deadlines that only turn a hang into a readable
failure; no test asserts how long anything took.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgflow_cli.worker import Flow, TaskContext, Worker, WorkerOptions
from tests.support.sqlrows import RowQueries

REPO = Path(__file__).resolve().parents[2]
PROC_WORKER = Path(__file__).with_name("proc_worker.py")

FAST = {
    # Short polls and heartbeats so stop/deprecation are noticed quickly; no effect on correctness.
    "max_poll_seconds": 1,
    "poll_interval_ms": 20,
    "heartbeat_interval": 0.3,
    "drain_timeout": 60.0,
}
DEADLINE = 90.0
"""Seconds before a wait gives up and fails the test (a hang guard, never a speed claim)."""


def stop_and_join(workers: Iterable[Worker], deadline: float = DEADLINE) -> None:
    """Ask every started worker to stop ("test finished"), then wait for each (``deadline`` s: a hang guard)."""
    chosen = list(workers)
    for worker in chosen:
        if worker.state not in ("created", "stopped"):
            worker.stop("test finished")
    for worker in chosen:
        if worker.state != "created":
            assert worker.join(deadline), f"worker {worker.worker_id} did not stop"


# ----------------------------------------------------------------------------------------------
# recording handler invocations
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    run_id: str
    step_slug: str
    task_index: int
    input: Any
    worker_id: str
    thread: str


class Recorder:
    """Thread-safe list of every handler invocation, across all workers of a process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: list[Call] = []

    def wrap(self, fn: Callable[[Any, TaskContext], Any]) -> Callable[[Any, TaskContext], Any]:
        """A handler that records ``(run_id, step_slug, task_index, input, worker)`` then calls ``fn``."""

        def handler(value: Any, ctx: TaskContext) -> Any:
            with self._lock:
                self._calls.append(Call(ctx.run_id, ctx.step_slug, ctx.task_index, value, ctx.worker_id,
                                        threading.current_thread().name))
            return fn(value, ctx)

        return handler

    @property
    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._calls)

    def keys(self) -> list[tuple[str, str, int]]:
        return [(c.run_id, c.step_slug, c.task_index) for c in self.calls]

    def duplicates(self) -> dict[tuple[str, str, int], int]:
        return {k: n for k, n in Counter(self.keys()).items() if n > 1}

    def for_step(self, step_slug: str, run_id: str | None = None) -> list[Call]:
        return [c for c in self.calls if c.step_slug == step_slug and (run_id is None or c.run_id == run_id)]

    def worker_ids(self) -> set[str]:
        return {c.worker_id for c in self.calls}


def assert_each_task_ran_exactly_once(env, run_ids: list[str], workers) -> int:
    """Compare the invocation record with step_tasks and the queues; returns the task count."""
    tasks = env.rows(
        "SELECT run_id::text AS run_id, step_slug, task_index, status, attempts_count, last_worker_id::text AS worker, "
        "message_id FROM pgflow.step_tasks WHERE run_id = ANY(%s::uuid[])", (run_ids,))
    not_once = [t for t in tasks if (t["status"], t["attempts_count"]) != ("completed", 1)]
    assert not_once == [], f"{len(not_once)} task(s) not completed exactly once, e.g. {not_once[:5]}"
    assert env.recorder.duplicates() == {}, "a task's handler ran more than once"
    by_key = {(t["run_id"], t["step_slug"], t["task_index"]): t for t in tasks}
    assert sorted(env.recorder.keys()) == sorted(by_key), "handler invocations differ from the task rows"
    # the worker that ran the handler is the worker the database recorded for the claim
    mismatched = [c for c in env.recorder.calls if by_key[(c.run_id, c.step_slug, c.task_index)]["worker"] != c.worker_id]
    assert mismatched == []
    ids = {w.worker_id for w in workers}
    assert {t["worker"] for t in tasks} <= ids
    stats = [w.stats.snapshot() for w in workers]
    assert sum(s["claimed"] for s in stats) == len(tasks)
    assert sum(s["completed"] for s in stats) == len(tasks)
    assert sum(s["failed"] for s in stats) == 0
    return len(tasks)


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = DEADLINE, interval: float = 0.05,
               describe: Callable[[], str] | None = None) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{describe()}" if describe else ""
            raise AssertionError(f"gave up after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(interval)


# ----------------------------------------------------------------------------------------------
# the test environment: one database, its workers and subprocesses
# ----------------------------------------------------------------------------------------------
class WorkerEnv(RowQueries):
    """A fresh database plus the workers and worker processes a test started (all stopped at teardown);
    plain SQL through ``rows``, ``one``, ``val`` (:class:`~tests.support.sqlrows.RowQueries`)."""

    def __init__(self, db) -> None:
        self.db = db
        self.conninfo: str = db.conninfo
        self.conn: psycopg.Connection = db.connect()
        self.conn.row_factory = dict_row
        self.recorder = Recorder()
        self.workers: list[Worker] = []
        self.procs: list[WorkerProcess] = []
        self.require_live_messages = True

    # -- workers --------------------------------------------------------------------------------
    def worker(self, flow: Flow, *, function_name: str | None = None, protocol: Any = None, **options: Any) -> Worker:
        """A Worker with the package's default protocol (or ``protocol``) and quick polling (not started);
        ``options`` are :class:`WorkerOptions` fields."""
        settings: dict[str, Any] = {**FAST, "application_name": "pgflow-worker-test", **options}
        worker = Worker(flow, self.conninfo, function_name=function_name or f"{flow.slug}-worker",
                        protocol=protocol, options=WorkerOptions(**settings))
        self.workers.append(worker)
        return worker

    def start_worker(self, flow: Flow, **options: Any) -> Worker:
        worker = self.worker(flow, **options)
        worker.start()
        return worker

    def stop_workers(self, workers: Iterable[Worker] | None = None) -> None:
        stop_and_join(list(workers) if workers is not None else list(self.workers))

    def spawn(self, *, function_name: str, worker_id: str, release_file: Path, extra_env: dict | None = None) -> WorkerProcess:
        proc = WorkerProcess.spawn(self.conninfo, function_name=function_name, worker_id=worker_id,
                                   release_file=release_file, extra_env=extra_env)
        self.procs.append(proc)
        return proc

    # -- runs -------------------------------------------------------------------------------------
    def start_run(self, flow_slug: str, run_input: Any) -> str:
        return str(self.val("SELECT run_id FROM pgflow.start_flow(%s, %s)", (flow_slug, Jsonb(run_input))))

    def start_runs(self, flow_slug: str, inputs: list[Any]) -> list[str]:
        """Start one run per input, in one statement (one transaction)."""
        rows = self.rows(
            "SELECT r.run_id FROM jsonb_array_elements(%s) WITH ORDINALITY AS i(value, ord), "
            "LATERAL pgflow.start_flow(%s, i.value) AS r ORDER BY i.ord",
            (Jsonb(inputs), flow_slug),
        )
        return [str(r["run_id"]) for r in rows]

    def run(self, run_id: str) -> dict:
        return self.one("SELECT * FROM pgflow.runs WHERE run_id = %s", (run_id,))

    def steps(self, run_id: str) -> dict[str, dict]:
        return {r["step_slug"]: r for r in self.rows("SELECT * FROM pgflow.step_states WHERE run_id = %s", (run_id,))}

    def tasks(self, run_id: str, step_slug: str | None = None) -> list[dict]:
        return self.rows(
            "SELECT * FROM pgflow.step_tasks WHERE run_id = %s AND (%s::text IS NULL OR step_slug = %s) "
            "ORDER BY step_slug, task_index",
            (run_id, step_slug, step_slug),
        )

    def task(self, run_id: str, step_slug: str, task_index: int = 0) -> dict:
        return self.one(
            "SELECT * FROM pgflow.step_tasks WHERE run_id = %s AND step_slug = %s AND task_index = %s",
            (run_id, step_slug, task_index),
        )

    def wait_runs_finished(self, run_ids: list[str], timeout: float = DEADLINE) -> list[dict]:
        """Wait until every run is completed or failed; returns the run rows."""

        def done() -> bool:
            left = self.val("SELECT count(*) FROM pgflow.runs WHERE run_id = ANY(%s::uuid[]) AND status = 'started'",
                            (run_ids,))
            return left == 0

        wait_until(done, f"{len(run_ids)} run(s) to finish", timeout=timeout, describe=self.describe_open_work)
        return self.rows("SELECT * FROM pgflow.runs WHERE run_id = ANY(%s::uuid[])", (run_ids,))

    def describe_open_work(self) -> str:
        rows = self.rows(
            "SELECT step_slug, status, count(*) AS n, max(attempts_count) AS max_attempts FROM pgflow.step_tasks "
            "GROUP BY 1, 2 ORDER BY 1, 2"
        )
        runs = self.rows("SELECT status, count(*) AS n FROM pgflow.runs GROUP BY 1 ORDER BY 1")
        stats = [(w.worker_id[:8], w.state, w.stats.snapshot()) for w in self.workers]
        return f"runs: {runs}\ntasks: {rows}\nworkers: {stats}"

    # -- queues ---------------------------------------------------------------------------------
    def queue_table(self, queue: str, prefix: str = "q") -> sql.Composable:
        name = self.val("SELECT pgmq.format_table_name(%s, %s)", (queue, prefix))
        return sql.SQL("pgmq.{}").format(sql.Identifier(name))

    def queue_names(self) -> list[str]:
        return [r["queue_name"] for r in self.rows("SELECT queue_name FROM pgmq.meta ORDER BY queue_name")]

    def queue_totals(self) -> dict[str, tuple[int, int]]:
        """``{queue: (messages still in the queue table, rows in its archive)}`` for every PGMQ queue."""
        totals = {}
        for queue in self.queue_names():
            live = self.val(sql.SQL("SELECT count(*) FROM {}").format(self.queue_table(queue)))
            archived = self.val(sql.SQL("SELECT count(*) FROM {}").format(self.queue_table(queue, "a")))
            totals[queue] = (live, archived)
        return totals

    def message(self, queue: str, msg_id: int) -> dict | None:
        return self.one(sql.SQL("SELECT * FROM {} WHERE msg_id = %s").format(self.queue_table(queue)), (msg_id,))

    def archived_messages(self, queue: str, msg_id: int) -> list[dict]:
        return self.rows(sql.SQL("SELECT * FROM {} WHERE msg_id = %s").format(self.queue_table(queue, "a")), (msg_id,))

    def worker_row(self, worker_id: str) -> dict | None:
        return self.one("SELECT * FROM pgflow.workers WHERE worker_id = %s", (worker_id,))

    # -- teardown -------------------------------------------------------------------------------
    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
        self.stop_workers()


# ----------------------------------------------------------------------------------------------
# worker subprocesses (tests/worker/proc_worker.py)
# ----------------------------------------------------------------------------------------------
class WorkerProcess:
    """A reference worker running ``Worker.run()`` in its own Python process.

    Its ``work`` handler prints ``STARTED <run_id> <pid>`` and blocks until ``release_file``
    exists. stdout and stderr are collected by reader threads.
    """

    def __init__(self, popen: subprocess.Popen, worker_id: str) -> None:
        self.popen = popen
        self.worker_id = worker_id
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._lock = threading.Lock()
        for stream, sink in ((popen.stdout, self.stdout), (popen.stderr, self.stderr)):
            threading.Thread(target=self._pump, args=(stream, sink), daemon=True).start()

    @classmethod
    def spawn(cls, conninfo: str, *, function_name: str, worker_id: str, release_file: Path,
              extra_env: dict | None = None) -> WorkerProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra_env or {})
        popen = subprocess.Popen(
            [sys.executable, str(PROC_WORKER), conninfo, function_name, worker_id, str(release_file)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO),
        )
        return cls(popen, worker_id)

    def _pump(self, stream, sink: list[str]) -> None:
        for line in stream:
            with self._lock:
                sink.append(line.rstrip("\n"))

    def lines(self, which: str = "stdout") -> list[str]:
        with self._lock:
            return list(self.stdout if which == "stdout" else self.stderr)

    def wait_for_line(self, needle: str, which: str = "stdout", timeout: float = DEADLINE) -> str:
        def found() -> str | None:
            for line in self.lines(which):
                if needle in line:
                    return line
            if self.popen.poll() is not None:
                raise AssertionError(f"worker process exited ({self.popen.returncode}) before printing {needle!r}:\n"
                                     + "\n".join(self.lines("stderr")[-30:]))
            return None

        return wait_until(found, f"{needle!r} from the worker process", timeout=timeout,
                          describe=lambda: "\n".join(self.lines("stderr")[-30:]))

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def wait(self, timeout: float = DEADLINE) -> int:
        return self.popen.wait(timeout=timeout)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(timeout=30)

"""Batched reports (issue 18): tasks that finish together are reported in one ``complete_tasks``
(or ``fail_tasks``) call; without those functions, or with ``batch_reports=False``, each task is
reported alone; a batch the database refuses is reported task by task, so the refused task
fails and the others complete; stopping sends every queued report first. A worker with more
batch room than handler slots claims ahead of its slots once it knows its handlers are fast.

The calls are counted by the database (``pg_stat_user_functions`` with ``track_functions``),
not by the worker. To hold several reports together, the test locks ``pgflow.step_tasks``: the
first report then waits for the lock (seen in ``pg_stat_activity``) while the others queue.
The batch functions are the queue stage's.
"""

from __future__ import annotations

import threading
from collections import Counter

from pgflow_cli.worker import Flow
from tests.worker.batch import (
    count_function_calls,
    ensure_batch_functions,
    function_calls,
    wait_for_calls,
)
from tests.worker.helpers import DEADLINE, wait_until

N = 6
"""Tasks of the map every test runs (all claimed in one read: max_concurrent = batch_size = N)."""


class Attempts:
    """Which attempt of each map element a handler call is (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: Counter[int] = Counter()

    def next(self, item: int) -> int:
        with self._lock:
            self._seen[item] += 1
            return self._seen[item]


def _map_flow(slug: str, env, release: threading.Event, handler) -> Flow:
    """A root map over the run input; every handler call waits for ``release`` first."""

    def each(item, ctx):
        assert release.wait(DEADLINE), "the test never released the handlers"
        return handler(item, ctx)

    return Flow(slug, max_attempts=2, base_delay=0).map("each", env.recorder.wrap(each))


def _hold_reports(env, worker, release: threading.Event):
    """Lock step_tasks, let every handler finish, and wait until the first report waits for the
    lock and all the others are queued behind it. Returns the open transaction holding the lock."""
    blocker = env.db.connect(autocommit=False)
    blocker.execute("LOCK TABLE pgflow.step_tasks IN SHARE MODE")
    release.set()

    def held() -> bool:
        waiting = env.val("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                          "AND application_name = 'pgflow-worker-test' "
                          "AND wait_event_type = 'Lock'")
        return waiting >= 1 and worker.tasks_in_flight() == 0

    wait_until(held, "a report to wait for the lock and every handler to finish")
    return blocker


def _start(env, slug: str, handler, **options):
    release = threading.Event()
    worker = env.start_worker(_map_flow(slug, env, release, handler), max_concurrent=N, batch_size=N, **options)
    run_id = env.start_run(slug, list(range(N)))
    wait_until(lambda: len(env.recorder.for_step("each")) == N, "every handler to start")
    return worker, run_id, release


def test_completions_that_finish_together_travel_in_one_call(env):
    count_function_calls(env)
    ensure_batch_functions(env)
    worker, run_id, release = _start(env, "batchDone", lambda item, ctx: item * 10)
    assert worker.reports_batched
    blocker = _hold_reports(env, worker, release)
    blocker.commit()
    [run] = env.wait_runs_finished([run_id])
    env.stop_workers()

    assert run["status"] == "completed" and run["output"] == {"each": [i * 10 for i in range(N)]}
    tasks = env.tasks(run_id)
    assert [(t["status"], t["attempts_count"]) for t in tasks] == [("completed", 1)] * N
    stats = worker.stats.snapshot()
    assert stats["completed"] == N and stats["batch_fallbacks"] == 0
    # all in one call, or the first alone (or with a few others) and the rest together
    assert stats["batch_reported"] >= N - 1
    assert 1 <= stats["report_batches"] <= 2
    assert wait_for_calls(env, "complete_tasks", stats["report_batches"]) == stats["report_batches"]
    assert function_calls(env, "fail_tasks") == 0


def test_failures_that_finish_together_travel_in_one_call_and_are_retried(env):
    count_function_calls(env)
    ensure_batch_functions(env)
    attempts = Attempts()

    def fail_first(item, ctx):
        if attempts.next(item) == 1:
            raise RuntimeError(f"first attempt of {item}")
        return item

    worker, run_id, release = _start(env, "batchFail", fail_first)
    blocker = _hold_reports(env, worker, release)
    blocker.commit()
    [run] = env.wait_runs_finished([run_id])
    env.stop_workers()

    assert run["status"] == "completed" and run["output"] == {"each": list(range(N))}
    assert [(t["status"], t["attempts_count"]) for t in env.tasks(run_id)] == [("completed", 2)] * N
    stats = worker.stats.snapshot()
    assert (stats["failed"], stats["completed"], stats["batch_fallbacks"]) == (N, N, 0)
    assert wait_for_calls(env, "fail_tasks", 1) <= 2


def test_a_batch_the_database_refuses_is_reported_task_by_task(env):
    """Two elements return an output a trigger refuses: whatever batch holds one raises and applied
    nothing; reported alone, the refused task fails (and its retry completes), the others complete."""
    ensure_batch_functions(env)
    env.conn.execute("""
        CREATE FUNCTION public.refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'poisoned output'; END $$;
        CREATE TRIGGER refuse_poison BEFORE UPDATE ON pgflow.step_tasks FOR EACH ROW
        WHEN (NEW.status = 'completed' AND NEW.output @> '{"poison": true}') EXECUTE FUNCTION public.refuse_poison();
    """)
    attempts = Attempts()

    def poison_two(item, ctx):
        return {"poison": True} if item < 2 and attempts.next(item) == 1 else {"ok": item}

    worker, run_id, release = _start(env, "batchPoison", poison_two)
    blocker = _hold_reports(env, worker, release)
    blocker.commit()
    [run] = env.wait_runs_finished([run_id])
    env.stop_workers()

    assert run["status"] == "completed"
    assert run["output"] == {"each": [{"ok": i} for i in range(N)]}
    tasks = {t["task_index"]: t for t in env.tasks(run_id)}
    assert {i: (t["status"], t["attempts_count"]) for i, t in tasks.items()} == {
        i: ("completed", 2 if i < 2 else 1) for i in range(N)}
    stats = worker.stats.snapshot()
    assert stats["batch_fallbacks"] >= 1
    assert stats["failed"] == 2 and stats["completed"] == N
    assert sorted(c.input for c in env.recorder.for_step("each")) == sorted([*range(N), 0, 1])


def test_without_batch_reports_every_task_is_reported_alone(env):
    count_function_calls(env)
    ensure_batch_functions(env)
    options = {"batch_reports": False}
    worker, run_id, release = _start(env, "singleDone", lambda item, ctx: item, **options)
    assert not worker.reports_batched
    release.set()
    [run] = env.wait_runs_finished([run_id])
    env.stop_workers()

    assert run["status"] == "completed" and run["output"] == {"each": list(range(N))}
    stats = worker.stats.snapshot()
    assert (stats["completed"], stats["report_batches"], stats["batch_reported"]) == (N, 0, 0)
    assert wait_for_calls(env, "complete_task", N) == N
    assert function_calls(env, "complete_tasks") == 0


def test_stopping_sends_every_queued_report_before_the_worker_is_marked_stopped(env):
    ensure_batch_functions(env)
    worker, run_id, release = _start(env, "drainDone", lambda item, ctx: item)
    blocker = _hold_reports(env, worker, release)
    worker.stop()
    wait_until(lambda: worker.state == "draining", "the worker to drain")
    assert not worker.join(0.3), "the worker stopped with reports still queued"
    assert env.worker_row(worker.worker_id)["stopped_at"] is None
    blocker.commit()
    assert worker.join(DEADLINE)

    tasks = env.tasks(run_id)
    assert [(t["status"], t["attempts_count"]) for t in tasks] == [("completed", 1)] * N
    assert env.run(run_id)["status"] == "completed"
    assert env.worker_row(worker.worker_id)["stopped_at"] >= max(t["completed_at"] for t in tasks)
    assert worker.stats.snapshot()["completed"] == N


def test_a_worker_with_fast_handlers_reads_more_than_its_free_slots(env):
    """Two handler slots, batches of 8: once handlers are known to be fast, reads are not capped
    at the free slots (``prefetch=False`` is, so this test fails without the prefetch)."""
    rec = env.recorder
    flow = Flow("prefetchFlow").step("only", rec.wrap(lambda value, ctx: value))
    setup = env.start_worker(flow, function_name="setup-worker")
    env.stop_workers([setup])
    run_ids = env.start_runs("prefetchFlow", [{"i": i} for i in range(80)])
    worker = env.start_worker(flow, max_concurrent=2, batch_size=8)
    env.wait_runs_finished(run_ids)
    env.stop_workers([worker])

    stats = worker.stats.snapshot()
    assert stats["claimed"] == stats["completed"] == 80
    assert stats["expired"] == 0
    assert stats["messages_read"] > 2 * stats["polls"], stats
    assert sorted(rec.keys()) == sorted((r, "only", 0) for r in run_ids)

"""How many tasks the worker claims beyond its free handler slots (the capacity rule of
pgflow_cli/worker/runner.py): nothing before a handler has finished, nothing while a handler
runs far longer than usual, nothing when the tasks could not start within half their visibility
window, at most ``batch_size`` more otherwise; and a claimed task that waited longer than its
timeout is not run. These check the rule itself on a Worker that never connects.
"""

from __future__ import annotations

import time

import pytest

from pgflow_cli.worker import ClaimedTask, Flow, Worker, WorkerOptions
from pgflow_cli.worker.protocol import StepSettings


def _worker(**options) -> Worker:
    flow = Flow("capacityFlow").step("only", lambda value, ctx: value)
    return Worker(flow, "dbname=never-connected", function_name="capacity-fn", options=WorkerOptions(**options))


def _finished(worker: Worker, seconds: float) -> Worker:
    worker._slot_seconds = seconds
    return worker


def test_no_prefetch_before_a_handler_has_finished():
    worker = _worker(max_concurrent=2, batch_size=8)
    assert worker._capacity() == 2


@pytest.mark.parametrize(("slot_seconds", "budget", "expected"), [
    (0.01, 30.0, 2 + 8),     # fast handlers, default 60 s timeout: a full batch more
    (0.2, 0.5, 2 + 2 * 2),   # two rounds of two slots fit in half a 1-second timeout
    (0.4, 0.5, 2 + 2),       # one round
    (0.6, 0.5, 2),           # a handler outlasts the budget: free slots only
])
def test_prefetch_fits_the_visibility_budget(slot_seconds, budget, expected):
    worker = _finished(_worker(max_concurrent=2, batch_size=8), slot_seconds)
    worker._start_budget = budget
    assert worker._capacity() == expected


def test_no_prefetch_while_a_handler_runs_far_longer_than_usual():
    worker = _finished(_worker(max_concurrent=2, batch_size=8), 0.01)
    worker._running[0] = time.monotonic() - 5  # stuck for 5 s, usually 10 ms
    assert worker._capacity() == 1


def test_prefetch_false_reads_only_free_slots():
    worker = _finished(_worker(max_concurrent=2, batch_size=8, prefetch=False), 0.01)
    assert worker._capacity() == 2
    worker._waiting = 2
    assert worker._capacity() == 0


def test_a_task_that_waited_past_its_timeout_is_not_run():
    calls = []
    flow = Flow("capacityFlow").step("only", lambda value, ctx: calls.append(value))
    worker = Worker(flow, "dbname=never-connected", function_name="capacity-fn")
    worker._settings = {"only": StepSettings(timeout=1, max_attempts=3, base_delay=1)}
    task = ClaimedTask(flow_slug="capacityFlow", run_id="00000000-0000-0000-0000-000000000001", step_slug="only",
                       input={}, message_id=1, task_index=0, flow_input={}, queue_name="capacityflow")
    worker._waiting = 1
    worker._execute(task, claimed_at=time.monotonic() - 5)
    assert calls == []
    assert worker.stats.snapshot()["expired"] == 1
    assert worker.tasks_in_flight() == 0

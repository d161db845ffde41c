"""Issue 3 acceptance: 1,000 runs of a diamond-plus-map flow through 4 reference workers.

Every run completes, every task completes exactly once (one handler invocation, one attempt),
no message is left in any queue, and every message was archived (archive rows == tasks).
"""

from __future__ import annotations

import pytest
from psycopg import sql

from tests.worker.flows import diamond_map_flow
from tests.worker.helpers import assert_each_task_ran_exactly_once

RUNS = 1000
WORKERS = 4
BATCHES = 10


@pytest.mark.slow
def test_thousand_runs_four_workers_every_task_exactly_once(env):
    flow = diamond_map_flow("acceptFlow", env.recorder)
    workers = [
        env.worker(flow, function_name="accept-worker", max_concurrent=8, batch_size=8, max_poll_seconds=1,
                   poll_interval_ms=10)
        for _ in range(WORKERS)
    ]
    for worker in workers:
        worker.start()
    inputs = [{"n": i % 3} for i in range(RUNS)]  # map sizes 0, 1, 2: empty maps included
    run_ids: list[str] = []
    step = RUNS // BATCHES
    for first in range(0, RUNS, step):  # runs keep arriving while the workers are busy
        run_ids += env.start_runs("acceptFlow", inputs[first:first + step])
    finished = env.wait_runs_finished(run_ids, timeout=240)
    env.stop_workers()

    assert len(finished) == RUNS
    assert {r["status"] for r in finished} == {"completed"}
    wrong = [r for r in finished
             if r["output"] != {"join": {"sum": sum(2 * i for i in range(r["input"]["n"])), "n": r["input"]["n"]}}]
    assert wrong == []
    total = assert_each_task_ran_exactly_once(env, run_ids, workers)
    assert total == sum(3 + n["n"] for n in inputs)
    assert env.val("SELECT count(*) FROM pgflow.step_tasks") == total

    totals = env.queue_totals()
    assert set(totals) == {workers[0].queue_name}
    assert {q: live for q, (live, _) in totals.items()} == {workers[0].queue_name: 0}, "messages left in a queue"
    assert sum(archived for _, archived in totals.values()) == total, "archive rows differ from the task count"
    # every task's own message is in the archive, once
    archived_tasks = sql.SQL(
        "SELECT count(DISTINCT a.msg_id) FROM {} AS a JOIN pgflow.step_tasks AS t ON t.message_id = a.msg_id"
    ).format(env.queue_table(workers[0].queue_name, "a"))
    assert env.val(archived_tasks) == total

"""A worker whose run an operator cancels while its handlers run: the handlers' stop signal fires
(at the next heartbeat) saying the run was cancelled and why; the results they return anyway are
refused by the database and counted (``refused``), never recorded; the worker goes on working."""

from __future__ import annotations

import threading

from pgflow_cli.worker import Flow
from tests.worker.helpers import DEADLINE, wait_until


def test_a_cancelled_runs_handlers_are_told_and_their_late_results_are_refused(env):
    started = threading.Semaphore(0)
    reasons: list[str | None] = []

    def patient(item, ctx):
        started.release()
        if item == "quick":
            return item
        assert ctx.stop.wait(DEADLINE), "the stop signal never fired"
        reasons.append(ctx.stop.reason)
        return {"late": item}  # the handler ignores the signal and returns: the result must be refused

    flow = Flow("cancelFlow", max_attempts=1).map("patient", patient)
    worker = env.start_worker(flow, max_concurrent=4, batch_size=4)
    run_id = env.start_run("cancelFlow", [1, 2, 3])
    for _ in range(3):
        assert started.acquire(timeout=DEADLINE)
    env.conn.execute("SELECT pgflow.cancel_run(%s, 'operator said stop')", (run_id,))

    wait_until(lambda: worker.stats.snapshot()["refused"] == 3, "the three late results to be refused")
    assert reasons == ["the run was cancelled: operator said stop"] * 3
    tasks = env.tasks(run_id, "patient")
    assert [(t["status"], t["output"], t["refused_reports"]) for t in tasks] == [("cancelled", None, 1)] * 3
    stats = worker.stats.snapshot()
    assert (stats["completed"], stats["failed"], stats["stop_signals"]) == (0, 0, 3)

    # not paused: the next run's tasks are claimed and completed
    [done] = env.wait_runs_finished([env.start_run("cancelFlow", ["quick"])])
    assert done["status"] == "completed"

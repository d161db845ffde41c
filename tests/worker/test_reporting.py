"""Reports the database refuses: a handler result or error that Python can encode but PostgreSQL
cannot store must still end the attempt (as a failure), never leave the task ``started``."""

from __future__ import annotations

import pytest

from pgflow_cli.worker import Flow
from tests.worker.helpers import wait_until


def _run_one(env, slug: str, handler):
    flow = Flow(slug, max_attempts=1, base_delay=0).step("only", env.recorder.wrap(handler))
    worker = env.start_worker(flow)
    run_id = env.start_run(slug, {})
    wait_until(lambda: env.recorder.for_step("only"), "the handler to run")
    # stop() drains: when join() returns, the handler has returned and its report was attempted
    worker.stop()
    assert worker.join(60)
    return run_id, worker



@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), "nul\x00byte"],
    ids=["nan", "infinity", "nul-in-string"],
)
def test_output_postgres_cannot_store_fails_the_task(env, value):
    run_id, worker = _run_one(env, "unstorableOut", lambda v, ctx: {"value": value})
    task = env.task(run_id, "only")
    assert task["status"] != "started", "the worker never reported the task"
    assert (task["status"], env.run(run_id)["status"]) == ("failed", "failed")


def test_error_message_with_nul_byte_still_fails_the_task(env):
    def explode(v, ctx):
        raise ValueError("bad\x00input")

    run_id, worker = _run_one(env, "nulError", explode)
    task = env.task(run_id, "only")
    assert task["status"] != "started", "the worker never reported the failure"
    assert (task["status"], env.run(run_id)["status"]) == ("failed", "failed")

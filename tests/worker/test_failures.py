"""Handler exceptions through the reference Worker: retries with attempts counted, then
exhaustion decided by ``when_exhausted`` (fail / skip / skip-cascade), checked on task rows,
step states and the run. Retries use base_delay 0, so they are visible again at once."""

from __future__ import annotations

import threading

from pgflow_cli.worker import Flow
from tests.worker.helpers import wait_until


class Flaky:
    """Raises for the first ``failures`` calls per (run, step, task), then returns ``value``."""

    def __init__(self, failures: int, value=None) -> None:
        self.failures = failures
        self.value = value
        self.seen: dict[tuple, int] = {}
        self.lock = threading.Lock()

    def __call__(self, value, ctx):
        key = (ctx.run_id, ctx.step_slug, ctx.task_index)
        with self.lock:
            self.seen[key] = self.seen.get(key, 0) + 1
            n = self.seen[key]
        if n <= self.failures:
            raise RuntimeError(f"flaky failure {n} of {ctx.step_slug}[{ctx.task_index}]")
        return self.value if self.value is not None else {"attempt": n}


def always_fail(value, ctx):
    raise ValueError(f"cannot handle {ctx.step_slug}")


def test_retries_until_success_count_every_attempt(env):
    rec = env.recorder
    flaky = Flaky(failures=2)
    flow = (
        Flow("retryFlow", max_attempts=3, base_delay=0)
        .step("shaky", rec.wrap(flaky))
        .step("next", rec.wrap(lambda deps, ctx: deps["shaky"]), depends_on=["shaky"])
    )
    worker = env.start_worker(flow)
    run_id = env.start_run("retryFlow", {"go": True})
    [run] = env.wait_runs_finished([run_id])

    assert run["status"] == "completed"
    assert run["output"] == {"next": {"attempt": 3}}
    shaky = env.task(run_id, "shaky")
    assert (shaky["status"], shaky["attempts_count"]) == ("completed", 3)
    assert shaky["output"] == {"attempt": 3}
    assert len(rec.for_step("shaky")) == 3
    assert all(c.input == {"go": True} for c in rec.for_step("shaky"))  # every attempt gets the run input
    nxt = env.task(run_id, "next")
    assert (nxt["status"], nxt["attempts_count"]) == ("completed", 1)

    # The worker counts a report once its transaction has committed, so the run can be seen
    # finished a moment before the last report is counted: wait for the count, do not sample it.
    def counted() -> tuple[int, int] | None:
        stats = worker.stats.snapshot()
        return (stats["failed"], stats["completed"]) if stats["completed"] >= 2 else None

    assert wait_until(counted, "the worker to count its last report") == (2, 2)
    # the message kept its id across retries and was archived once, at completion
    assert [m["msg_id"] for m in env.archived_messages(worker.queue_name, shaky["message_id"])] == [shaky["message_id"]]


def test_exhausted_with_fail_fails_the_run_and_cancels_the_siblings(env):
    rec = env.recorder
    def patient(value, ctx):
        # stays in flight until the run has failed: its late completion must not count
        wait_until(lambda: env_status(env, ctx.run_id) == "failed", "the run to fail")
        return "too late"

    flow = (
        Flow("failFlow", max_attempts=2, base_delay=0)
        .step("bad", rec.wrap(always_fail))
        .step("sibling", rec.wrap(patient))
        .step("child", rec.wrap(lambda deps, ctx: deps), depends_on=["bad", "sibling"])
    )
    worker = env.start_worker(flow, max_concurrent=4)
    run_id = env.start_run("failFlow", {})
    [run] = env.wait_runs_finished([run_id])
    # the late report is refused (its task was cancelled with the run), and counted as such
    wait_until(lambda: len(rec.for_step("sibling")) == 1 and worker.stats.snapshot()["refused"] >= 1,
               "the sibling's late report")
    assert worker.stats.snapshot()["completed"] == 0

    assert run["status"] == "failed" and run["output"] is None and run["failed_at"] is not None
    bad = env.task(run_id, "bad")
    assert (bad["status"], bad["attempts_count"]) == ("failed", 2)
    assert bad["error_message"] == "ValueError: cannot handle bad"
    assert len(rec.for_step("bad")) == 2
    sibling = env.task(run_id, "sibling")
    assert (sibling["status"], sibling["output"]) == ("cancelled", None)  # the late completion changed nothing
    steps = env.steps(run_id)
    assert steps["bad"]["status"] == "failed"
    assert steps["child"]["status"] == "created" and env.tasks(run_id, "child") == []
    assert rec.for_step("child") == []


def env_status(env, run_id):
    with env.db.connect() as conn:
        return conn.execute("SELECT status FROM pgflow.runs WHERE run_id = %s", (run_id,)).fetchone()[0]


def test_exhausted_with_skip_releases_children_without_the_output(env):
    rec = env.recorder
    flow = (
        Flow("skipFlow", max_attempts=2, base_delay=0)
        .step("good", rec.wrap(lambda run_input, ctx: "fine"))
        .step("optional", rec.wrap(always_fail), when_exhausted="skip")
        .step("merge", rec.wrap(lambda deps, ctx: sorted(deps)), depends_on=["good", "optional"])
    )
    env.start_worker(flow)
    run_id = env.start_run("skipFlow", {})
    [run] = env.wait_runs_finished([run_id])

    assert run["status"] == "completed"
    assert run["output"] == {"merge": ["good"]}
    [merge] = rec.for_step("merge")
    assert merge.input == {"good": "fine"}  # the skipped dependency is absent
    optional = env.task(run_id, "optional")
    assert (optional["status"], optional["attempts_count"]) == ("failed", 2)
    assert len(rec.for_step("optional")) == 2
    state = env.steps(run_id)["optional"]
    assert (state["status"], state["skip_reason"]) == ("skipped", "handler_failed")


def test_exhausted_with_skip_cascade_skips_the_descendants(env):
    rec = env.recorder
    flow = (
        Flow("cascadeFlow", max_attempts=1, base_delay=0)
        .step("keep", rec.wrap(lambda run_input, ctx: 1))
        .map("items", rec.wrap(lambda item, ctx: always_fail(item, ctx) if item == "x" else item),
             when_exhausted="skip-cascade")
        .step("below", rec.wrap(lambda deps, ctx: deps), depends_on=["items"])
        .step("further", rec.wrap(lambda deps, ctx: deps), depends_on=["below", "keep"])
    )
    # one task at a time, so the map's failing element is exhausted while its siblings may still be queued
    env.start_worker(flow, max_concurrent=1, batch_size=1)
    run_id = env.start_run("cascadeFlow", ["a", "x", "b"])
    [run] = env.wait_runs_finished([run_id])

    assert run["status"] == "completed"
    assert run["output"] == {}  # the only leaf was skipped
    steps = env.steps(run_id)
    assert (steps["items"]["status"], steps["items"]["skip_reason"]) == ("skipped", "handler_failed")
    assert (steps["below"]["status"], steps["below"]["skip_reason"]) == ("skipped", "dependency_skipped")
    assert (steps["further"]["status"], steps["further"]["skip_reason"]) == ("skipped", "dependency_skipped")
    assert steps["keep"]["status"] == "completed"
    items = {t["task_index"]: t for t in env.tasks(run_id, "items")}
    assert items[1]["status"] == "failed" and items[1]["attempts_count"] == 1
    # every items task is terminal: the ones that ran completed or were skipped, none is left open
    assert {t["status"] for t in items.values()} <= {"completed", "failed", "skipped"}
    assert rec.for_step("below") == [] and rec.for_step("further") == []


def test_unserialisable_output_is_a_handler_failure(env):
    rec = env.recorder
    flow = Flow("badOutputFlow", max_attempts=2, base_delay=0).step("returns_set", rec.wrap(lambda v, ctx: {1, 2}))
    env.start_worker(flow)
    run_id = env.start_run("badOutputFlow", {})
    [run] = env.wait_runs_finished([run_id])

    assert run["status"] == "failed"
    task = env.task(run_id, "returns_set")
    assert (task["status"], task["attempts_count"]) == ("failed", 2)
    assert task["error_message"] == "handler output cannot be stored: Object of type set is not JSON serializable"
    assert len(rec.for_step("returns_set")) == 2

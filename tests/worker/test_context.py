"""What a handler sees in its TaskContext, on a real server: its attempt and the step's maximum,
the run input from any step (read once per run, never in messages), its deadline, and a stop
signal set when the worker drains, when its run ends while it runs, and when stalled-task
recovery has queued its task again or given it to another worker."""

from __future__ import annotations

import threading
from datetime import timedelta

from pgflow_cli.worker import STOP_DRAINING, Flow
from pgflow_cli.worker.protocol import LATEST
from tests.worker.helpers import DEADLINE, wait_until


class Seen:
    """What each handler call saw (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[dict] = []

    def add(self, **item) -> None:
        with self.lock:
            self.items.append(item)

    def of(self, step: str) -> list[dict]:
        with self.lock:
            return [i for i in self.items if i["step"] == step]


def test_attempts_count_up_to_the_steps_maximum_and_the_last_one_says_so(env):
    seen = Seen()

    def flaky(value, ctx):
        seen.add(step=ctx.step_slug, attempt=ctx.attempt, most=ctx.max_attempts, last=ctx.is_last_attempt)
        if not ctx.is_last_attempt:
            raise RuntimeError(f"attempt {ctx.attempt} fails")
        return {"succeeded_at": ctx.attempt}

    flow = (Flow("attemptFlow", max_attempts=3, base_delay=0)
            .step("flow_default", flaky)
            .step("own_maximum", flaky, max_attempts=2))
    env.start_worker(flow)
    run_id = env.start_run("attemptFlow", {})
    [run] = env.wait_runs_finished([run_id])

    assert run["status"] == "completed"
    assert [(i["attempt"], i["most"], i["last"]) for i in seen.of("flow_default")] == [
        (1, 3, False), (2, 3, False), (3, 3, True)]
    assert [(i["attempt"], i["most"], i["last"]) for i in seen.of("own_maximum")] == [(1, 2, False), (2, 2, True)]
    # the attempt a handler saw is the one the database counted
    assert env.task(run_id, "flow_default")["attempts_count"] == 3
    assert env.task(run_id, "own_maximum")["attempts_count"] == 2


def test_every_step_gets_the_run_input_read_once_per_run_and_never_carried_in_messages(env):
    seen = Seen()

    def record(value, ctx):
        seen.add(step=ctx.step_slug, run=ctx.run_id, flow_input=ctx.flow_input)
        return value

    flow = (Flow("inputFlow")
            .map("each", record)  # a root map: its tasks carry no run input
            .step("after", record, depends_on=["each"]))
    worker = env.start_worker(flow, max_concurrent=4)
    inputs = {"a": [1, 2, 3], "b": [4, 5]}
    runs = {name: env.start_run("inputFlow", value) for name, value in inputs.items()}
    env.wait_runs_finished(list(runs.values()))

    by_run = {run_id: name for name, run_id in runs.items()}
    assert len(seen.items) == 3 + 2 + 2
    assert all(item["flow_input"] == inputs[by_run[item["run"]]] for item in seen.items)
    assert worker._inputs.reads == 2, "each run's input is read once, by the first task that asks"
    bodies = [m["message"] for m in env.rows(f"SELECT message FROM pgmq.a_{worker.queue_name}")]
    assert len(bodies) == 7 and all(set(body) == {"flow_slug", "run_id", "step_slug", "task_index"} for body in bodies)


def test_a_root_step_gets_the_run_input_from_its_claim_without_another_read(env):
    seen = Seen()
    flow = (Flow("rootInputFlow")
            .step("root", lambda value, ctx: seen.add(step="root", value=value, flow_input=ctx.flow_input) or 1)
            .step("child", lambda deps, ctx: seen.add(step="child", flow_input=ctx.flow_input) or 2,
                  depends_on=["root"]))
    worker = env.start_worker(flow)
    env.wait_runs_finished([env.start_run("rootInputFlow", {"user": 7})])
    assert seen.of("root") == [{"step": "root", "value": {"user": 7}, "flow_input": {"user": 7}}]
    assert seen.of("child") == [{"step": "child", "flow_input": {"user": 7}}]
    assert worker._inputs.reads == 0  # the root's claim carried it; the child used the kept copy


def test_the_deadline_is_the_claim_plus_the_effective_timeout(env):
    seen = Seen()

    def look(value, ctx):
        seen.add(step=ctx.step_slug, deadline=ctx.deadline, left=ctx.seconds_left())
        return None

    flow = Flow("deadlineFlow", timeout=40).step("flow_timeout", look).step("own_timeout", look, timeout=7)
    env.start_worker(flow)
    run_id = env.start_run("deadlineFlow", {})
    env.wait_runs_finished([run_id])
    for step, timeout in (("flow_timeout", 40), ("own_timeout", 7)):
        [item] = seen.of(step)
        task = env.task(run_id, step)
        assert 0 < item["left"] <= timeout
        # taken before the claim: never later than the database's claim time + timeout
        assert task["started_at"] + timedelta(seconds=timeout) - timedelta(seconds=1) \
            <= item["deadline"] <= task["started_at"] + timedelta(seconds=timeout)


def test_draining_sets_the_stop_signal_of_running_handlers(env):
    seen = Seen()
    started = threading.Event()

    def cooperative(value, ctx):
        started.set()
        stopped = ctx.stop.wait(DEADLINE)
        seen.add(step=ctx.step_slug, stopped=stopped, reason=ctx.stop.reason)
        return {"gave_up_early": stopped}

    worker = env.start_worker(Flow("drainSignalFlow").step("work", cooperative))
    run_id = env.start_run("drainSignalFlow", {})
    assert started.wait(DEADLINE)
    worker.stop()
    assert worker.join(DEADLINE)
    assert seen.of("work") == [{"step": "work", "stopped": True, "reason": STOP_DRAINING}]
    assert env.task(run_id, "work")["output"] == {"gave_up_early": True}


class CountingProtocol(LATEST):
    """The latest protocol, counting heartbeats, the stop-signal checks (and how many tasks each
    covered) and the reads of attempt numbers (and how many tasks each covered)."""

    def __init__(self) -> None:
        super().__init__()
        self.heartbeats = 0
        self.checks: list[int] = []
        self.attempt_reads: list[int] = []

    def claimed_attempts(self, conn, *, message_ids, **rest):
        self.attempt_reads.append(len(message_ids))
        return super().claimed_attempts(conn, message_ids=message_ids, **rest)

    def heartbeat(self, conn, worker_id, **route):
        self.heartbeats += 1
        return super().heartbeat(conn, worker_id, **route)

    def ended_tasks(self, conn, worker_id, running):
        self.checks.append(len(running))
        return super().ended_tasks(conn, worker_id, running)


def test_a_run_that_fails_while_handlers_run_sets_their_stop_signals_with_one_check_per_heartbeat(env):
    seen = Seen()
    waiting = threading.Semaphore(0)

    def patient(item, ctx):
        waiting.release()
        stopped = ctx.stop.wait(DEADLINE)
        seen.add(step=ctx.step_slug, stopped=stopped, reason=ctx.stop.reason)
        return item

    def bad(value, ctx):
        for _ in range(4):  # fail only once every patient handler runs
            assert waiting.acquire(timeout=DEADLINE)
        raise RuntimeError("this run cannot go on")

    flow = (Flow("abortFlow", max_attempts=1)
            .map("patient", patient)
            .step("bad", bad))
    protocol = CountingProtocol()
    worker = env.start_worker(flow, protocol=protocol, max_concurrent=5, batch_size=5)
    run_id = env.start_run("abortFlow", [1, 2, 3, 4])
    [run] = env.wait_runs_finished([run_id])
    assert run["status"] == "failed"
    wait_until(lambda: len(seen.of("patient")) == 4, "the patient handlers to learn that their run failed")

    assert [(i["stopped"], i["reason"]) for i in seen.of("patient")] == [(True, "the run failed")] * 4
    assert worker.stats.snapshot()["stop_signals"] == 4
    # the check is one query for all running tasks (the four patient ones, and the bad one while it
    # had not failed yet), made at heartbeats only
    assert protocol.checks and set(protocol.checks) <= {4, 5} and protocol.checks[-1] == 4
    assert len(protocol.checks) <= protocol.heartbeats
    assert {t["status"] for t in env.tasks(run_id, "patient")} == {"cancelled"}


class Overtaken:
    """A handler whose first attempt waits for its stop signal (then returns "stale"), and whose
    next attempt waits until the first has learnt it lost the task (then returns "fresh")."""

    def __init__(self) -> None:
        self.seen = Seen()
        self.first = threading.Event()

    def __call__(self, value, ctx):
        if ctx.attempt == 1:
            self.first.set()
            stopped = ctx.stop.wait(DEADLINE)
            self.seen.add(step=ctx.step_slug, attempt=1, stopped=stopped, reason=ctx.stop.reason)
            return "stale"
        wait_until(lambda: self.seen.of("work"), "the old handler's stop signal")
        self.seen.add(step=ctx.step_slug, attempt=ctx.attempt, stopped=False, reason=None)
        return "fresh"

    def stall(self, env, run_id: str) -> None:
        """Once the first attempt runs, make its claim older than timeout + 30 s and let stalled-task
        recovery requeue the task."""
        assert self.first.wait(DEADLINE)
        env.conn.execute("UPDATE pgflow.step_tasks SET started_at = started_at - interval '40 seconds', "
                         "queued_at = queued_at - interval '40 seconds' WHERE run_id = %s", (run_id,))
        assert env.val("SELECT pgflow.requeue_stalled_tasks()") == 1


def test_a_task_stalled_recovery_gave_to_another_worker_stops_its_old_handler_and_keeps_its_result(env, caplog):
    handler = Overtaken()
    seen = handler.seen
    flow = Flow("takenOverFlow", timeout=1).step("work", handler)
    old = env.start_worker(flow, function_name="old-worker", max_concurrent=1)  # busy: cannot claim it again
    run_id = env.start_run("takenOverFlow", {})
    handler.stall(env, run_id)
    env.start_worker(flow, function_name="new-worker")
    [run] = env.wait_runs_finished([run_id])
    wait_until(lambda: len(seen.of("work")) == 2, "the old handler to learn its task was taken over")

    # the old attempt's late result is not reported: the database would have let it end attempt 2
    assert run["status"] == "completed" and run["output"] == {"work": "fresh"}
    # the old worker's heartbeat sees the task either requeued (before the new worker claims it) or
    # claimed by the new worker: both mean "do not report", or its late result would end attempt 2
    stale = [i for i in seen.of("work") if i["attempt"] == 1]
    assert stale[0]["stopped"] and stale[0]["reason"] in (
        "another worker took the task over (attempt 2)", "stalled-task recovery queued the task again (after attempt 1)")
    assert old.stats.snapshot()["stop_signals"] == 1
    wait_until(lambda: any(f"not reported, {stale[0]['reason']}" in r.getMessage()
                           for r in caplog.records), "the old worker to say it kept its result")
    assert old.stats.snapshot()["completed"] == 0


def test_a_handler_that_learns_its_task_was_requeued_is_not_reported_even_once_another_worker_claims_it(env, caplog):
    """The old worker's heartbeat sees the task queued again (nobody has claimed it yet); by the time
    its handler returns, a new worker runs attempt 2. The old result must not be sent: the database
    would take it as attempt 2's."""
    requeued = threading.Event()

    def handler(value, ctx):
        if ctx.attempt == 1:
            if ctx.stop.wait(DEADLINE):
                requeued.set()
            wait_until(lambda: env.val("SELECT attempts_count FROM pgflow.step_tasks WHERE status = 'started'") == 2,
                       "the new worker to claim attempt 2")
            return "stale"
        wait_until(lambda: any("not reported" in r.getMessage() for r in caplog.records)
                   or old.stats.snapshot()["completed"], "the old worker to decide about its result")
        return "fresh"

    flow = Flow("requeuedFlow", timeout=1).step("work", handler)
    old = env.start_worker(flow, function_name="old-worker", max_concurrent=1)
    run_id = env.start_run("requeuedFlow", {})
    wait_until(lambda: env.val("SELECT count(*) FROM pgflow.step_tasks WHERE status = 'started'") == 1,
               "attempt 1 to start")
    env.conn.execute("UPDATE pgflow.step_tasks SET started_at = started_at - interval '40 seconds', "
                     "queued_at = queued_at - interval '40 seconds' WHERE run_id = %s", (run_id,))
    assert env.val("SELECT pgflow.requeue_stalled_tasks()") == 1
    assert requeued.wait(DEADLINE)  # the old worker learnt it while the task was queued
    env.start_worker(flow, function_name="new-worker")
    [run] = env.wait_runs_finished([run_id])

    assert run["status"] == "completed" and run["output"] == {"work": "fresh"}
    assert old.stats.snapshot()["completed"] == 0
    assert any("not reported, stalled-task recovery queued the task again (after attempt 1)" in r.getMessage()
               for r in caplog.records)


def test_handlers_that_take_no_context_get_only_their_input(env):
    async def shout(deps):
        return deps["plain"].upper()

    flow = Flow("noContextFlow").step("plain", lambda run_input: run_input["word"]).step(
        "loud", shout, depends_on=["plain"])
    env.start_worker(flow)
    run_id = env.start_run("noContextFlow", {"word": "quiet"})
    [run] = env.wait_runs_finished([run_id])
    assert (run["status"], run["output"]) == ("completed", {"loud": "QUIET"})


def test_attempt_numbers_are_read_once_per_claim_and_only_when_asked(env):
    protocol = CountingProtocol()
    seen = Seen()
    flow = (Flow("lazyAttemptFlow")
            .map("ask", lambda item, ctx: seen.add(step="ask", attempt=ctx.attempt) or item)
            .map("never_ask", lambda item, ctx: item, array="ask"))
    env.start_worker(flow, protocol=protocol, max_concurrent=6, batch_size=6)
    [run] = env.wait_runs_finished([env.start_run("lazyAttemptFlow", list(range(6)))])
    assert run["status"] == "completed"
    assert [i["attempt"] for i in seen.of("ask")] == [1] * 6
    # the six "ask" tasks came in claims that read their attempts once each; "never_ask" read none
    assert sum(protocol.attempt_reads) == 6 and len(protocol.attempt_reads) <= 6


def test_a_newer_claim_in_the_same_worker_stops_the_older_attempt_and_keeps_its_result(env, caplog):
    handler = Overtaken()
    seen = handler.seen
    worker = env.start_worker(Flow("reclaimFlow", timeout=1).step("work", handler), max_concurrent=2)
    run_id = env.start_run("reclaimFlow", {})
    handler.stall(env, run_id)  # the same worker, with a free slot, claims it again
    [run] = env.wait_runs_finished([run_id])
    assert run["output"] == {"work": "fresh"}
    [stale] = [i for i in seen.of("work") if i["attempt"] == 1]
    assert stale["stopped"] and stale["reason"] == "a newer claim of the task runs in this worker"
    wait_until(lambda: any("not reported, a newer claim of the task runs in this worker" in r.getMessage()
                           for r in caplog.records), "the old attempt to be dropped")
    assert worker.stats.snapshot()["completed"] == 1

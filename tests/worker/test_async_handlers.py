"""``async def`` handlers on the worker's own event loop, on a real server: they run to completion
beside ``def`` handlers, as many at once as the worker has slots, report failures like any
handler, and a forced stop cancels them cleanly. A plain function that returns a coroutine is
refused with a clear error."""

from __future__ import annotations

import asyncio
import threading
import warnings

from pgflow_cli.worker import STOP_DRAINING, Flow
from tests.worker.helpers import DEADLINE, wait_until


def test_async_and_sync_steps_run_one_flow_each_on_its_own_side(env):
    threads: dict[str, str] = {}

    async def double(item, ctx):
        threads[ctx.step_slug] = threading.current_thread().name
        await asyncio.sleep(0)
        return item * 2

    async def total(deps, ctx):
        threads[ctx.step_slug] = threading.current_thread().name
        run_input = await ctx.flow_input_async()
        return {"sum": sum(deps["double"]), "of": run_input}

    def seed(run_input, ctx):
        threads[ctx.step_slug] = threading.current_thread().name
        return run_input

    flow = (Flow("mixedFlow")
            .step("seed", seed)
            .map("double", double, array="seed")
            .step("total", total, depends_on=["double"]))
    worker = env.start_worker(flow)
    run_id = env.start_run("mixedFlow", [1, 2, 3])
    [run] = env.wait_runs_finished([run_id])

    assert run["status"] == "completed" and run["output"] == {"total": {"sum": 12, "of": [1, 2, 3]}}
    assert threads["seed"].startswith("pgflow-task")
    assert threads["double"] == threads["total"] == "pgflow-async"
    assert worker.stats.snapshot()["completed"] == 5


def test_async_handlers_fill_every_slot_at_once(env):
    slots = 6
    running = 0
    most = 0
    lock = threading.Lock()
    all_in = threading.Event()

    async def overlap(item, ctx):
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
            if running == slots:
                all_in.set()
        try:
            # each handler waits until all six run at the same time: only possible when the
            # loop runs them concurrently, each in its own slot
            while not all_in.is_set():
                await asyncio.sleep(0.01)
            return item
        finally:
            with lock:
                running -= 1

    worker = env.start_worker(Flow("slotsFlow").map("each", overlap), max_concurrent=slots, batch_size=slots)
    run_id = env.start_run("slotsFlow", list(range(slots * 2)))
    [run] = env.wait_runs_finished([run_id])
    assert run["status"] == "completed"
    assert most == slots
    assert worker.stats.snapshot()["completed"] == slots * 2


def test_an_async_handlers_exception_is_the_tasks_failure(env):
    async def broken(value, ctx):
        await asyncio.sleep(0)
        raise LookupError(f"no record for attempt {ctx.attempt}")

    env.start_worker(Flow("asyncFailFlow", max_attempts=2, base_delay=0).step("only", broken))
    run_id = env.start_run("asyncFailFlow", {})
    [run] = env.wait_runs_finished([run_id])
    task = env.task(run_id, "only")
    assert (run["status"], task["status"], task["attempts_count"]) == ("failed", "failed", 2)
    assert task["error_message"] == "LookupError: no record for attempt 2"


def test_a_plain_function_that_returns_a_coroutine_is_refused_clearly(env):
    async def real_work(value):
        return value

    def forgot_async(value, ctx):
        return real_work(value)  # a coroutine, never awaited

    env.start_worker(Flow("forgotAsyncFlow", max_attempts=1).step("only", forgot_async))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_id = env.start_run("forgotAsyncFlow", {"x": 1})
        [run] = env.wait_runs_finished([run_id])
    task = env.task(run_id, "only")
    assert (run["status"], task["status"]) == ("failed", "failed")
    assert task["error_message"] == (
        "TypeError: the handler of step 'only' is a plain function that returned a coroutine; declare the handler "
        "itself `async def` (the worker awaits it on its event loop)")
    assert not [w for w in caught if "never awaited" in str(w.message)]


def test_draining_tells_async_handlers_and_stop_now_cancels_them_cleanly(env):
    events: list[str] = []
    started = threading.Event()

    async def stubborn(value, ctx):
        started.set()
        await ctx.stop.wait_async()
        events.append(f"told: {ctx.stop.reason}")
        try:
            await asyncio.sleep(3600)  # ignores the drain
        finally:
            events.append("cleaned up")
        return "never"

    worker = env.start_worker(Flow("cancelFlow").step("only", stubborn), drain_timeout=DEADLINE)
    run_id = env.start_run("cancelFlow", {})
    assert started.wait(DEADLINE)
    worker.stop()
    wait_until(lambda: events, "the handler to learn of the drain")
    assert not worker.join(0.2), "the drain must wait for the handler"
    worker.stop_now("test: stop now")
    assert worker.join(DEADLINE)

    assert events == [f"told: {STOP_DRAINING}", "cleaned up"]
    stats = worker.stats.snapshot()
    assert (stats["cancelled"], stats["completed"], stats["failed"]) == (1, 0, 0)
    assert worker.left_running == 0  # the cancelled handler ended; its task is the database's to recover
    task = env.task(run_id, "only")
    assert (task["status"], task["attempts_count"]) == ("started", 1)  # left to stalled-task recovery
    assert env.worker_row(worker.worker_id)["stopped_at"] is not None


class Concurrency:
    """How many handlers (of any kind) run at once, and the most seen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


def test_def_and_async_def_handlers_share_the_slots_and_never_exceed_them(env):
    slots = 4
    seen = Concurrency()

    async def waits(item, ctx):
        seen.enter()
        try:
            await asyncio.sleep(0.05)  # long enough for the claims ahead of the slots to arrive meanwhile
            return item
        finally:
            seen.leave()

    def blocks(item, ctx):
        seen.enter()
        try:
            threading.Event().wait(0.05)
            return item
        finally:
            seen.leave()

    flow = (Flow("sharedSlotsFlow")
            .step("items", lambda run_input, ctx: run_input)
            .map("coroutines", waits, array="items")
            .map("threads", blocks, array="items"))
    # batch_size beyond the slots: once it has seen a handler finish, the worker claims ahead of them
    worker = env.start_worker(flow, max_concurrent=slots, batch_size=20)
    run_ids = [env.start_run("sharedSlotsFlow", list(range(20))) for _ in range(3)]
    runs = env.wait_runs_finished(run_ids)
    assert {r["status"] for r in runs} == {"completed"}
    assert seen.most == slots
    # the worker counts a task once its report returns, which can trail the run's end by a moment
    wait_until(lambda: worker.stats.snapshot()["completed"] == 3 * (1 + 20 + 20), "every task counted completed",
               describe=lambda: str(worker.stats.snapshot()))

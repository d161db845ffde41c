"""The worker as a library, before any database: what importing it pulls in, its own errors,
immutable flows, typed options, handler checks at definition, the handler-control exceptions,
failure texts, the stop signal and the JSON log format."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone

import pytest

from pgflow_cli.errors import UsageError
from pgflow_cli.worker import (
    MAX_RETRY_DELAY,
    DefinitionError,
    FailNow,
    Flow,
    InvalidRetryDelay,
    RetryLater,
    StopSignal,
    TaskContext,
    Worker,
    WorkerOptions,
    flow_worker,
    with_step_queues,
)
from pgflow_cli.worker.failures import MAX_ERROR_MESSAGE, MAX_STORED_TRACEBACK, RetryPolicy, TaskFailure
from pgflow_cli.worker.logs import JsonFormatter
from tests.worker.helpers import REPO

NOWHERE = "host=/nonexistent/pgflow-test port=1 connect_timeout=1"


def noop(value, ctx):
    return value


# ----------------------------------------------------------------------------------------------
# a library, not a CLI internal
# ----------------------------------------------------------------------------------------------
def test_importing_the_worker_imports_no_command_line_or_rendering_package():
    probe = ("import sys, pgflow_cli.worker\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'typer', 'click', 'rich', 'tabulate'}))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=str(REPO), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("build", [
    lambda: Flow("bad__slug"),
    lambda: Flow("f").step("a", noop).step("a", noop),
    lambda: Flow("f").step("b", noop, depends_on=["missing"]),
    lambda: Flow("f", timeout=0),
    lambda: with_step_queues(Flow("f" * 45).step("ok", noop).step("b" * 5, noop)),
    lambda: Worker(with_step_queues(Flow("f").step("a", noop)), NOWHERE, function_name="x"),
    lambda: WorkerOptions(max_concurrent=0),
    lambda: WorkerOptions(drain_timeout=math.nan),
], ids=["slug", "duplicate-step", "unknown-dependency", "option", "queue-names", "step-worker", "concurrency",
        "nan-duration"])
def test_definition_errors_are_the_librarys_own(build):
    with pytest.raises(DefinitionError) as caught:
        build()
    assert not isinstance(caught.value, UsageError)
    assert isinstance(caught.value, ValueError)  # application code may catch it as a bad value
    assert caught.value.exit_code == 2 and caught.value.message  # what `pgflow worker` exits with


def test_each_builder_call_returns_a_new_flow_and_leaves_the_old_one_alone():
    base = Flow("shop").step("cart", noop)
    held_by_another_module = base
    queued = with_step_queues(base)
    longer = base.step("pay", noop, depends_on=["cart"])
    mapped = base.map("each", noop)
    assert held_by_another_module.step_slugs == ["cart"] and held_by_another_module.shape() == base.shape()
    assert longer.step_slugs == ["cart", "pay"] and mapped.step_slugs == ["cart", "each"]
    assert queued.step_slugs == ["cart"]
    assert isinstance(base.steps, tuple)
    with pytest.raises(AttributeError):
        base.slug = "other"  # type: ignore[misc]


def test_options_are_typed_fields_and_reach_the_worker():
    options = WorkerOptions(max_concurrent=3, batch_size=7, log_tracebacks=True)
    worker = flow_worker(Flow("typed").step("a", noop), NOWHERE, function_name="typed-worker", options=options)
    assert worker.options is options and worker.options.max_concurrent == 3
    assert Worker(Flow("typed").step("a", noop), NOWHERE, function_name="t").options == WorkerOptions()
    with pytest.raises(TypeError):
        WorkerOptions(no_such_option=1)  # type: ignore[call-arg]


# ----------------------------------------------------------------------------------------------
# handlers checked at definition
# ----------------------------------------------------------------------------------------------
async def async_handler(value, ctx):
    return value


class AsyncCallable:
    async def __call__(self, value, ctx):
        return value


def test_async_handlers_are_recognised_also_through_partial_and_callable_objects():
    flow = (Flow("kinds").step("plain", noop).step("coro", async_handler)
            .step("partial", functools.partial(async_handler)).step("object", AsyncCallable()))
    assert [flow.get_step(s).is_async for s in flow.step_slugs] == [False, True, True, True]


def gen(value, ctx):
    yield value


async def agen(value, ctx):
    yield value


@pytest.mark.parametrize(("handler", "needle"), [
    (gen, "generator function"),
    (agen, "generator function"),
    (lambda: None, "must accept (input, context) or (input)"),
    (lambda value, ctx, extra: value, "must accept (input, context) or (input)"),
    ("not callable", "must be callable"),
], ids=["generator", "async-generator", "no-argument", "three-arguments", "not-callable"])
def test_handlers_that_can_never_work_are_refused_at_definition(handler, needle):
    with pytest.raises(DefinitionError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        Flow("refused").step("a", handler)


def test_handlers_with_defaults_or_star_args_are_accepted_and_one_argument_ones_get_no_context():
    async def no_context(value):
        return value

    flow = (Flow("ok").step("a", lambda value, ctx=None, *rest: value).step("b", lambda *args: args[0])
            .step("c", print).step("d", lambda value: value).step("e", no_context))
    assert [flow.get_step(s).takes_context for s in flow.step_slugs] == [True, True, True, False, False]
    ctx = TaskContext(flow_slug="ok", run_id="r", step_slug="d")
    assert flow.get_step("d").call(7, ctx) == 7
    assert asyncio.run(flow.get_step("e").call(8, ctx)) == 8


# ----------------------------------------------------------------------------------------------
# RetryLater and FailNow
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("when", [-1, -0.001, math.nan, math.inf, -math.inf, MAX_RETRY_DELAY + 1, timedelta(seconds=-5),
                                  datetime(2030, 1, 1), datetime.now(timezone.utc) + timedelta(days=30000), True,
                                  "20", None],
                         ids=["negative", "negative-fraction", "nan", "inf", "-inf", "too-long", "negative-timedelta",
                              "naive-datetime", "far-datetime", "bool", "string", "none"])
def test_an_unusable_retry_delay_is_refused_when_raised(when):
    with pytest.raises(InvalidRetryDelay) as caught:
        RetryLater(when)
    assert isinstance(caught.value, ValueError) and not isinstance(caught.value, UsageError)


def test_retry_delays_in_every_form():
    assert RetryLater(20).delay() == 20.0
    assert RetryLater(0).delay() == 0.0
    assert RetryLater(2.5).delay() == 2.5
    assert RetryLater(timedelta(minutes=2)).delay() == 120.0
    assert RetryLater(MAX_RETRY_DELAY).delay() == MAX_RETRY_DELAY
    now = datetime(2030, 1, 1, tzinfo=timezone.utc)
    at = RetryLater(datetime(2030, 1, 1, 0, 1, tzinfo=timezone(timedelta(hours=0))))
    assert at.at is not None and at.seconds is None
    assert at.delay(now) == 60.0
    assert at.delay(now + timedelta(hours=1)) == 0.0  # a moment already past: as soon as possible


def test_directive_texts_name_their_cause():
    try:
        try:
            raise ConnectionError("provider said 429")
        except ConnectionError as exc:
            raise RetryLater(20) from exc
    except RetryLater as retry:
        assert str(retry) == "ConnectionError: provider said 429"
        failure = TaskFailure.from_exception(retry)
    assert failure.message == "RetryLater: ConnectionError: provider said 429"
    assert failure.retry is not None and failure.retry.delay() == 20 and not failure.fail_now
    gone = TaskFailure.from_exception(FailNow("document 7 is gone"))
    assert (gone.message, gone.fail_now, gone.retry) == ("FailNow: document 7 is gone", True, None)
    assert str(RetryLater(5, "busy")) == "busy"


# ----------------------------------------------------------------------------------------------
# failure texts and what the database does with them
# ----------------------------------------------------------------------------------------------
def _deep(level: int):
    if level == 0:
        raise ValueError("x" * 3000)
    _deeper(level - 1)


def _deeper(level: int):
    _deep(level)  # alternating frames: Python does not fold them into "line repeated N times"


def test_a_stored_traceback_is_bounded_and_keeps_the_innermost_frames():
    try:
        _deep(300)
    except ValueError as exc:
        plain = TaskFailure.from_exception(exc)
        stored = TaskFailure.from_exception(exc, store_traceback=True)
    assert plain.message == plain.summary and len(plain.message) == MAX_ERROR_MESSAGE
    assert stored.summary == plain.summary and stored.message.startswith(plain.summary + "\n\n")
    tail = stored.message[len(plain.summary) + 2:]
    assert len(tail) <= MAX_STORED_TRACEBACK + 100
    assert "characters of the traceback left out" in tail
    assert tail.rstrip().endswith("ValueError: " + "x" * 3000)  # the innermost part, the exception itself
    assert stored.traceback and "Traceback (most recent call last)" in stored.traceback


def test_the_next_attempt_follows_the_steps_backoff_until_the_database_takes_directives():
    policy = RetryPolicy(max_attempts=3, base_delay=5)
    plain = TaskFailure.plain("boom", "RuntimeError")
    assert [policy.next_attempt_in(n, plain, retry_control=False) for n in (1, 2, 3)] == [10, 20, None]
    retry = TaskFailure.from_exception(RetryLater(42))
    fail = TaskFailure.from_exception(FailNow("no"))
    assert policy.next_attempt_in(1, retry, retry_control=False) == 10
    assert policy.next_attempt_in(1, fail, retry_control=False) == 10
    assert policy.next_attempt_in(1, retry, retry_control=True) == 42
    assert policy.next_attempt_in(3, retry, retry_control=True) is None  # exhausted: the override is ignored
    assert policy.next_attempt_in(1, fail, retry_control=True) is None


# ----------------------------------------------------------------------------------------------
# the stop signal and the context
# ----------------------------------------------------------------------------------------------
def test_the_stop_signal_wakes_threads_and_coroutines():
    signal = StopSignal()
    assert not signal.is_set() and signal.wait(0.01) is False
    woke: list[object] = []
    waiting = threading.Thread(target=lambda: woke.append(signal.wait(60)))
    waiting.start()

    async def wait_async():
        started.set()
        return await signal.wait_async(60)

    started = threading.Event()
    result: list[bool] = []
    loop_thread = threading.Thread(target=lambda: result.append(asyncio.run(wait_async())))
    loop_thread.start()
    assert started.wait(30)
    signal.set("the run failed")
    signal.set("the worker is stopping")  # the first reason stays
    waiting.join(30)
    loop_thread.join(30)
    assert woke == [True] and result == [True]
    assert signal.is_set() and signal.reason == "the run failed"
    assert asyncio.run(StopSignal().wait_async(0.01)) is False


def test_a_context_built_by_a_handlers_own_test():
    ctx = TaskContext(flow_slug="f", run_id="r", step_slug="s", attempt=3, max_attempts=3, flow_input={"k": 1},
                      deadline=datetime.now(timezone.utc) + timedelta(seconds=30))
    assert ctx.is_last_attempt and ctx.flow_input == {"k": 1} and asyncio.run(ctx.flow_input_async()) == {"k": 1}
    assert 0 < ctx.seconds_left() <= 30
    assert not TaskContext(flow_slug="f", run_id="r", step_slug="s", attempt=1, max_attempts=3).is_last_attempt
    with pytest.raises(LookupError):
        _ = TaskContext(flow_slug="f", run_id="r", step_slug="s").flow_input


def test_json_log_lines_carry_the_worker_fields_and_the_traceback():
    try:
        raise KeyError("missing")
    except KeyError as exc:
        record = logging.LogRecord("pgflow.worker", logging.WARNING, __file__, 1, "task failed %s", ("x",),
                                   (type(exc), exc, exc.__traceback__))
    record.__dict__.update(event="task_failed", flow="f", step="s", attempt=1, max_attempts=3, retry_in_seconds=2.0)
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "WARNING" and line["message"] == "task failed x"
    assert (line["event"], line["flow"], line["attempt"], line["max_attempts"], line["retry_in_seconds"]) == (
        "task_failed", "f", 1, 3, 2.0)
    assert "KeyError: 'missing'" in line["traceback"]

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


class UnreadableMessage(Exception):
    def __str__(self):
        raise RuntimeError("str() of this exception is broken")


class ItemsRaise(dict):
    """A dict whose serialisation raises something json does not document (RuntimeError)."""

    def items(self):
        raise RuntimeError("cannot list items")


def _finished(env, run_id):
    task = env.task(run_id, "only")
    assert task["status"] != "started", "the attempt was never recorded: the task is stuck started"
    return task


def test_error_text_with_a_lone_surrogate_is_recorded_readably(env):
    def explode(v, ctx):
        raise ValueError("bad file name \udcff.csv")

    run_id, _worker = _run_one(env, "surrogateError", explode)
    task = _finished(env, run_id)
    assert task["status"] == "failed"
    assert task["error_message"] == "ValueError: bad file name \\udcff.csv"


def test_an_exception_whose_str_raises_is_recorded(env):
    def explode(v, ctx):
        raise UnreadableMessage()

    run_id, _worker = _run_one(env, "brokenStrError", explode)
    task = _finished(env, run_id)
    assert task["status"] == "failed"
    assert task["error_message"] == "UnreadableMessage: <its message could not be read: str() raised RuntimeError>"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (ItemsRaise(a=1), "serialising it as JSON raised RuntimeError"),
        ("nested", "it is nested too deeply to serialise as JSON"),
        ({"name": "lone \ud800 surrogate"}, "a lone surrogate"),
    ],
    ids=["serialiser-raises", "too-deep", "lone-surrogate"],
)
def test_output_that_cannot_even_be_serialised_fails_the_task(env, value, reason):
    if value == "nested":
        value = []
        for _ in range(100_000):
            value = [value]
    run_id, _worker = _run_one(env, "oddOutput", lambda v, ctx: value)
    task = _finished(env, run_id)
    assert task["status"] == "failed"
    assert task["error_message"].startswith("handler output cannot be stored: ")
    assert reason in task["error_message"]


def test_the_literal_text_backslash_u0000_is_stored_as_it_is(env):
    text = "C:\\u0000\\path and \\\\u0000"
    run_id, _worker = _run_one(env, "literalEscape", lambda v, ctx: {"text": text, text: 1})
    task = _finished(env, run_id)
    assert task["status"] == "completed", task["error_message"]
    assert task["output"] == {"text": text, text: 1}


@pytest.mark.parametrize("value", [{"k\x00": 1}, ["a", {"b": "c\x00d"}]], ids=["nul-in-key", "nul-nested"])
def test_a_real_nul_anywhere_is_still_refused(env, value):
    run_id, _worker = _run_one(env, "realNul", lambda v, ctx: value)
    task = _finished(env, run_id)
    assert task["status"] == "failed"
    assert "NUL character" in task["error_message"]

"""The Python side of private step queues, before any database access (spec "Type-quality
requirements", "Generated per-step names"): opting in keeps the steps, the complete route map
is checked up front, and worker/step combinations are refused at construction."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from pgflow_cli.worker import (
    DefinitionError,
    Flow,
    StepQueuedFlow,
    Worker,
    flow_worker,
    step_worker,
    with_step_queues,
)

EXAMPLES = Path(__file__).with_name("typing_examples")
NOWHERE = "host=/nonexistent/pgflow-test port=1 connect_timeout=1"
"""A conninfo no server answers: a worker built with it proves nothing was contacted."""


def noop(value, ctx):
    return value


def two_steps(slug: str = "scrape") -> Flow:
    return Flow(slug).step("fetch", noop).step("parse", noop, depends_on=["fetch"])


def test_opting_in_keeps_the_steps_and_the_shape():
    flow = two_steps()
    queued = with_step_queues(flow)
    assert isinstance(queued, StepQueuedFlow) and not isinstance(queued, Flow)
    assert queued.step_slugs == flow.step_slugs == ["fetch", "parse"]
    assert queued.shape() == flow.shape()
    assert queued.routes == {"fetch": "scrape__fetch", "parse": "scrape__parse"}
    assert queued.route_map() == [{"stepSlug": "fetch", "queueName": "scrape__fetch"},
                                  {"stepSlug": "parse", "queueName": "scrape__parse"}]
    assert queued.get_step("parse").handler is noop
    # building on the original flow makes a new flow: neither it nor the step-queued one changes
    longer = flow.step("late", noop)
    assert longer.step_slugs == ["fetch", "parse", "late"]
    assert flow.step_slugs == queued.step_slugs == ["fetch", "parse"]


def test_routes_are_lowercase_and_fall_back_to_the_index():
    flow_slug = "Mixed" + "x" * 35  # 40 characters
    flow = Flow(flow_slug).step("abCde", noop).step("abcdefg", noop)
    for index in range(2, 11):
        flow = flow.step(f"s{index}long", noop)
    routes = with_step_queues(flow).routes
    assert routes["abCde"] == flow_slug.lower() + "__abcde"  # 47: readable fits
    assert routes["abcdefg"] == flow_slug.lower() + "__1"  # 49 readable: index fallback
    assert routes["s10long"] == flow_slug.lower() + "__10"  # two-digit index fallback
    assert all(len(q) <= 47 for q in routes.values())


def test_a_flow_that_cannot_get_names_is_rejected_whole_naming_steps_and_lengths():
    flow = Flow("f" * 45).step("ok", noop).step("b" * 5, noop)
    with pytest.raises(DefinitionError) as caught:
        with_step_queues(flow)
    text = caught.value.message + "\n" + "\n".join(caught.value.detail)
    assert "'ok' (index 0)" in text and "'bbbbb' (index 1)" in text
    assert "47" in text and "nothing was changed" in caught.value.hint
    assert f"{'f' * 45}__ok has 49 characters and {'f' * 45}__0 has 48" in text


def test_opting_in_needs_steps_and_current_slug_rules():
    with pytest.raises(DefinitionError, match="no steps"):
        with_step_queues(Flow("empty"))
    with pytest.raises(DefinitionError, match="legacy_slugs"):
        with_step_queues(Flow("old_", legacy_slugs=True).step("a", noop))


def test_step_worker_must_name_a_step_and_plain_worker_must_not():
    queued = with_step_queues(two_steps())
    worker = step_worker(queued, "parse", NOWHERE, function_name="scrape-parse")
    assert (worker.queue_name, worker.step_slug, worker.state) == ("scrape__parse", "parse", "created")
    with pytest.raises(DefinitionError, match="serves exactly one step"):
        Worker(queued, NOWHERE, function_name="scrape")
    with pytest.raises(DefinitionError, match="has no step 'nope'") as caught:
        step_worker(queued, "nope", NOWHERE, function_name="scrape")
    assert "fetch, parse" in caught.value.hint
    with pytest.raises(DefinitionError, match="plain flow"):
        Worker(two_steps("plain"), NOWHERE, function_name="plain", step_slug="fetch")
    assert flow_worker(two_steps("plain"), NOWHERE, function_name="plain").queue_name == "plain"


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (pip install -e '.[test]')")
def test_type_checker_sees_step_slugs(tmp_path):
    def mypy(name: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--no-error-summary", "--hide-error-context", "--follow-imports=silent",
             "--cache-dir", str(tmp_path / "cache"), str(EXAMPLES / name)],
            capture_output=True, text=True, timeout=300)

    good = mypy("good.py")
    assert good.returncode == 0, good.stdout + good.stderr
    bad = mypy("bad.py")
    expected = [n for n, line in enumerate((EXAMPLES / "bad.py").read_text().splitlines(), 1) if "# error" in line]
    flagged = sorted({int(line.split(":")[1]) for line in bad.stdout.splitlines() if ": error:" in line})
    assert flagged == expected, bad.stdout

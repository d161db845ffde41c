"""Manual completion and failure go through the cores every report goes through
(``_complete_started_tasks``, ``_fail_started_task``): the same realtime events as a worker's report
of the same step, and a [TYPE_VIOLATION] that fails the run whatever ``when_exhausted`` says."""

from __future__ import annotations

import pytest

from pgflow_cli.worker.flow import Flow
from tests.manual.test_lifecycle import complete, fail
from tests.runtime.driver import realtime_events
from tests.runtime.test_optional import _fake_realtime


def _noop(value, ctx):
    return None


def test_manual_reports_send_the_events_a_worker_report_sends(rt, author):
    _fake_realtime(rt)
    for slug, manual in (("byHand", True), ("byWorker", False)):
        handler = {"manual": True} if manual else {"handler": _noop}
        author(Flow(slug).step("check", **handler).map("each", _noop, array="check")
               .step("last", _noop, depends_on=["each"]).step("side", **handler, max_attempts=1))
    hand, worker = rt.start("byHand", {}), rt.start("byWorker", {})
    claimed = {t["step_slug"]: t for t in rt.poll("byWorker")}
    complete(rt, hand, "check", 0, [])
    rt.complete(worker, "check", claimed["check"]["task_index"], [])
    fail(rt, hand, "side", 0, "no")
    rt.fail(worker, "side", claimed["side"]["task_index"], "no")

    by_hand, by_worker = realtime_events(rt, [hand]), realtime_events(rt, [worker])
    assert [e for _, e, _ in by_hand] == ["run:started", "step:check:started", "step:side:started",
                                          "step:check:completed", "step:each:completed", "step:last:started",
                                          "step:side:failed", "run:failed"]
    assert by_hand == by_worker


@pytest.mark.parametrize("when_exhausted", ["skip", "skip-cascade"])
def test_a_type_violation_fails_a_manual_run_whatever_when_exhausted_says(rt, author, when_exhausted):
    author(Flow("typedByHand").step("requests", manual=True, when_exhausted=when_exhausted)
           .map("each", _noop, array="requests"))
    run = rt.start("typedByHand", {})
    task = complete(rt, run, "requests", 0, "one")
    assert (task["status"], task["output"]) == ("failed", "one")
    assert task["error_message"] == ('[TYPE_VIOLATION] step "requests" returned string, but map step(s) "each" need a '
                                     'JSON array from it')
    assert rt.statuses(run) == {"requests": "failed", "each": "created"}
    assert rt.run(run)["status"] == "failed"

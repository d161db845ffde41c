"""Fences side by side: two fences on different functions at once, and a fence on a function
whose workers serve two flows."""

from __future__ import annotations

import json

from tests.fence.helpers import WINDOW, wait_until


def test_two_fences_on_different_functions_drain_and_restore_independently(fenv):
    a = fenv.spawn("a-worker", "alpha")
    b = fenv.spawn("b-worker", "beta")
    runs_a, runs_b = fenv.start_runs("alpha", 1), fenv.start_runs("beta", 1)
    wait_until(lambda: fenv.started(runs_a) == 1 and fenv.started(runs_b) == 1, "one task in flight per flow")

    common = ("--heartbeat-window", WINDOW, "--interval", "0.1", "--timeout", "120", "--format", "json")
    fence_a = fenv.cli_background("disable", "--function", "a-worker", "-m", "alpha v2", *common)
    fence_b = fenv.cli_background("disable", "--flow", "beta", "-m", "beta v2", *common)
    wait_until(lambda: fenv.enabled("a-worker") is False and fenv.enabled("b-worker") is False, "both fences")
    a.wait_for_line("stops polling and drains", "stderr")
    b.wait_for_line("stops polling and drains", "stderr")

    fenv.release(runs_a[0])  # only alpha's task may finish
    done_a = fence_a.finish()
    assert done_a.code == 0, done_a.output
    assert json.loads(done_a.stdout)["drain"]["functions"] == ["a-worker"]
    assert fence_b.popen.poll() is None, "beta's fence still waits for its own task"
    assert fenv.started(runs_b) == 1

    # alpha's rollout ends while beta's fence is still up
    restore_a = fenv.cli("restore", "--function", "a-worker", "--format", "json")
    assert restore_a.code == 0, restore_a.output
    assert [f["function_name"] for f in json.loads(restore_a.stdout)["functions"]] == ["a-worker"]
    assert (fenv.enabled("a-worker"), fenv.enabled("b-worker")) == (True, False)
    status = json.loads(fenv.cli("status", "--format", "json").stdout)
    assert [(f["function_name"], f["reason"]) for f in status["fences"]] == [("b-worker", "beta v2")]

    fenv.release(runs_b[0])
    done_b = fence_b.finish()
    assert done_b.code == 0, done_b.output
    assert fenv.cli("restore", "--flow", "beta").code == 0
    assert fenv.val("SELECT count(*) FROM pgflow.fences WHERE state = 'active'") == 0
    assert set(fenv.ran().values()) == {1}


def test_a_fence_on_a_function_shared_by_two_flows_drains_both(fenv):
    # one worker function (think: one deployed edge function) hosts the workers of two flows
    first = fenv.spawn("shared-worker", "invoices")
    second = fenv.spawn("shared-worker", "refunds")
    invoices, refunds = fenv.start_runs("invoices", 1), fenv.start_runs("refunds", 1)
    wait_until(lambda: fenv.started(invoices) == 1 and fenv.started(refunds) == 1, "tasks in flight in both flows")
    other = fenv.spawn("audit-worker", "refunds")  # another function serves refunds too

    dry = fenv.cli("disable", "--flow", "invoices", "-m", "shared v2", "--dry-run", "--format", "json")
    assert dry.code == 0, dry.output
    document = json.loads(dry.stdout)
    assert [(f["function_name"], f["action"], f["flows"]) for f in document["functions"]] == [
        ("shared-worker", "fenced", ["invoices", "refunds"])]
    assert sorted(w["worker_id"] for w in document["workers_deprecated"]) == sorted([first.worker_id, second.worker_id])
    assert fenv.enabled("shared-worker") is True  # a dry run changes nothing
    assert fenv.val("SELECT count(*) FROM pgflow.workers WHERE deprecated_at IS NOT NULL") == 0

    disable = fenv.cli_background("disable", "--flow", "invoices", "-m", "shared v2", "--heartbeat-window", WINDOW,
                                  "--interval", "0.1", "--timeout", "120")
    wait_until(lambda: fenv.enabled("shared-worker") is False, "the fence")
    first.wait_for_line("stops polling and drains", "stderr")
    second.wait_for_line("stops polling and drains", "stderr")
    fenv.release(invoices[0])
    wait_until(lambda: first.exited(), "the invoices worker to finish its task and stop")
    # the refunds worker of the same function still holds a task: the drain goes on
    assert disable.popen.poll() is None and second.popen.poll() is None
    assert fenv.enabled("audit-worker") is True and not other.exited()  # the other function is untouched

    fenv.release()
    result = disable.finish()
    assert result.code == 0, result.output
    assert "note: shared-worker also serves refunds; those flows pause too" in result.stdout
    assert first.wait() == 0 and second.wait() == 0
    assert set(fenv.ran().values()) == {1}

"""Disable while tasks are in flight, drain, deploy, restore: real worker processes, real tasks."""

from __future__ import annotations

import json

from tests.fence.helpers import WINDOW, wait_until

FN = "orders-worker"
FLOW = "orders"


def _fenced_and_deprecated(fenv, function_name: str) -> bool:
    return fenv.enabled(function_name) is False and fenv.val(
        "SELECT count(*) FROM pgflow.workers WHERE function_name = %s AND stopped_at IS NULL AND deprecated_at IS NULL",
        (function_name,)) == 0


def test_in_place_rollout_drains_in_flight_tasks_and_loses_or_repeats_nothing(fenv):
    old = fenv.spawn(FN, FLOW)
    runs = fenv.start_runs(FLOW, 3)
    wait_until(lambda: fenv.started(runs) == 3, "three work tasks in flight")

    disable = fenv.cli_background("disable", "--flow", FLOW, "-m", "deploy orders v2", "--heartbeat-window", WINDOW,
                                  "--interval", "0.1", "--timeout", "120")
    wait_until(lambda: _fenced_and_deprecated(fenv, FN), "the function disabled and its worker deprecated")
    wait_until(lambda: any("3 task(s) in flight" in line for line in disable.err), "the live view to show the tasks")
    assert disable.popen.poll() is None, "the drain cannot be over while three tasks are in flight"

    old.wait_for_line("stops polling and drains", "stderr")  # its next heartbeat saw the deprecation
    fenv.release()
    result = disable.finish()
    assert result.code == 0, result.output
    assert "drained after" in result.stdout and "next: deploy the new code" in result.stdout
    assert old.wait() == 0
    # the tasks in flight finished; what follows waits, queued, for the new code
    assert fenv.task_states(runs) == {("work", "completed"): 3, ("after", "queued"): 3}
    fence = fenv.rows("SELECT * FROM pgflow.fences")
    assert [(f["function_name"], f["previous_enabled"], f["state"], f["reason"], f["workers_deprecated"])
            for f in fence] == [(FN, True, "active", "deploy orders v2", 1)]

    # the new code deployed during the fence cannot start yet: its supervisor retries after the restore
    early = fenv.spawn(FN, FLOW, wait_registered=False)
    assert early.wait() == 6 and any("pgflow fence status" in line for line in early.lines("stderr"))
    restore = fenv.cli_background("restore", "--flow", FLOW, "--wait-heartbeat", "--timeout", "120",
                                  "--heartbeat-window", WINDOW, "--interval", "0.1", "--format", "json")
    wait_until(lambda: fenv.enabled(FN), "the restore to enable the function again")
    new = fenv.spawn(FN, FLOW)
    result = restore.finish()
    assert result.code == 0, result.output
    document = json.loads(result.stdout)
    assert document["outcome"] == "confirmed"
    assert [(f["function_name"], f["action"], f["enabled"]) for f in document["functions"]] == [(FN, "restored", True)]
    assert [w["worker_id"] for w in document["new_workers"]] == [new.worker_id]

    wait_until(lambda: fenv.task_states(runs) == {("work", "completed"): 3, ("after", "completed"): 3},
               "the runs to finish on the new worker")
    ran = fenv.ran()
    assert sorted(ran) == sorted([(r, "work", 0) for r in runs] + [(r, "after", 0) for r in runs])
    assert set(ran.values()) == {1}, f"a handler ran more than once: {ran}"
    attempts = fenv.rows("SELECT DISTINCT attempts_count FROM pgflow.step_tasks WHERE run_id = ANY(%s::uuid[])", (runs,))
    assert attempts == [{"attempts_count": 1}]

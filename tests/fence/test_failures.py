"""The drain's bounded waits: --timeout names what still runs (exit 5), a worker killed with
SIGKILL ages out and its started tasks are reported, Ctrl-C leaves the fence in place (exit 130)."""

from __future__ import annotations

import json
import re

from tests.fence.helpers import WINDOW, wait_until

FN = "ship-worker"
FLOW = "ship"


def _in_flight(fenv, count: int) -> tuple:
    proc = fenv.spawn(FN, FLOW)
    runs = fenv.start_runs(FLOW, count)
    wait_until(lambda: fenv.started(runs) == count, f"{count} work task(s) in flight")
    return proc, runs


def test_timeout_names_every_worker_and_task_still_in_flight(fenv):
    proc, runs = _in_flight(fenv, 2)
    result = fenv.cli("disable", "--function", FN, "-m", "deploy", "--timeout", "1", "--interval", "0.2",
                      "--heartbeat-window", WINDOW)
    assert result.code == 5, result.output
    assert "the drain did not finish within 1 s: 1 worker(s) still live, 2 task(s) in flight" in result.stderr
    assert f"worker {proc.worker_id} ({FN}, {FLOW}," in result.stderr
    for run_id in runs:
        assert f"task {FLOW}/work[0] of run {run_id}" in result.stderr
    assert re.search(rf"pgflow fence restore --dsn '[^']*' --function {FN}", result.stderr)  # the target repeated
    assert fenv.enabled(FN) is False  # the fence stays
    # the same in JSON: the document on stdout says timeout and lists them, the error on stderr
    again = fenv.cli("disable", "--function", FN, "-m", "deploy", "--timeout", "0", "--format", "json",
                     "--heartbeat-window", WINDOW)
    assert again.code == 5
    document = json.loads(again.stdout)
    assert document["outcome"] == "timeout" and document["functions"][0]["action"] == "already_fenced"
    assert [w["worker_id"] for w in document["drain"]["live_workers"]] == [proc.worker_id]
    assert sorted(t["run_id"] for t in document["drain"]["started_tasks"]) == sorted(runs)
    assert json.loads(again.stderr)["exit_code"] == 5


def test_a_killed_worker_ages_out_and_its_started_tasks_are_reported(fenv):
    proc, runs = _in_flight(fenv, 1)
    disable = fenv.cli_background("disable", "--function", FN, "-m", "deploy", "--heartbeat-window", WINDOW,
                                  "--interval", "0.2", "--timeout", "120", "--format", "json")
    wait_until(lambda: fenv.enabled(FN) is False, "the fence")
    proc.kill()  # dies without marking itself stopped; its task stays started
    result = disable.finish()
    assert result.code == 0, result.output
    drain = json.loads(result.stdout)["drain"]
    assert drain["state"] == "drained" and drain["live_workers"] == []
    assert (drain["tasks_in_flight"], drain["tasks_stranded"]) == (0, 1)
    [task] = drain["started_tasks"]
    assert (task["run_id"], task["step_slug"], task["in_flight"], task["worker_id"]) == (runs[0], "work", False, proc.worker_id)
    assert task["recovery_at"]  # stalled recovery requeues it then; the new workers run it
    assert fenv.val("SELECT stopped_at FROM pgflow.workers WHERE worker_id = %s", (proc.worker_id,)) is None
    assert fenv.started(runs) == 1

    # the table form says so too
    table = fenv.cli("disable", "--function", FN, "-m", "deploy", "--heartbeat-window", WINDOW)
    assert table.code == 0
    assert "1 started task(s) are stranded" in table.stdout and f"of run {runs[0]}" in table.stdout


def test_ctrl_c_stops_watching_and_the_fence_stays(fenv):
    _in_flight(fenv, 1)
    disable = fenv.cli_background("disable", "--function", FN, "-m", "deploy", "--heartbeat-window", WINDOW,
                                  "--interval", "0.2")
    wait_until(lambda: any("1 task(s) in flight" in line for line in disable.err), "the live view")
    disable.interrupt()
    result = disable.finish()
    assert result.code == 130, result.output
    assert "stopped watching: the fence stays in place" in result.stderr
    assert re.search(rf"undo: `pgflow fence restore --dsn '[^']*' --function {FN}`", result.stderr)
    assert fenv.enabled(FN) is False
    assert fenv.val("SELECT count(*) FROM pgflow.fences WHERE state = 'active'") == 1


def test_a_draining_worker_keeps_heartbeating_so_its_long_task_stays_in_flight(fenv):
    proc, runs = _in_flight(fenv, 1)
    assert fenv.cli("disable", "--function", FN, "-m", "deploy", "--detach").code == 0
    proc.wait_for_line("stops polling and drains", "stderr")
    # longer than the heartbeat window after its deprecation, the worker still heartbeats
    wait_until(lambda: fenv.val("SELECT last_heartbeat_at - deprecated_at > make_interval(secs => %s::float8 + 0.5) "
                                "FROM pgflow.workers WHERE worker_id = %s", (WINDOW, proc.worker_id)),
               "a heartbeat more than one window after the deprecation")
    status = json.loads(fenv.cli("status", "--format", "json", "--heartbeat-window", WINDOW).stdout)
    assert [w["worker_id"] for w in status["drain"]["live_workers"]] == [proc.worker_id]
    assert (status["drain"]["tasks_in_flight"], status["drain"]["tasks_stranded"]) == (1, 0)
    fenv.release()
    assert proc.wait() == 0

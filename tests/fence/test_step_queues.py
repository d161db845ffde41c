"""Per-step replacement of a step-queued flow with the real `pgflow worker` processes: fence one
step's function, the other step keeps running, the fenced step's work waits in its private queue."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fence.helpers import WINDOW, wait_until
from tests.stage2.helpers import CliWorker

FLOWS = Path(__file__).with_name("flows_module.py")
FLOW = "fenceSteps"
FETCH, PARSE = "scrape-fetch-worker", "scrape-parse-worker"


def _step_worker(fenv, step: str, function_name: str) -> CliWorker:
    worker = CliWorker.start(fenv.conninfo, f"{FLOWS}:steps", "--step", step, "--function", function_name,
                             env={"FENCE_GATE": str(fenv.gate)})
    fenv.procs.append(worker)
    return worker


def _ran(workers) -> list[tuple[str, str]]:
    return [tuple(line.split()[1:3]) for w in workers for line in w.lines() if line.startswith("RAN ")]


def test_fencing_one_step_function_leaves_the_other_step_running(fenv):
    fetch = _step_worker(fenv, "fetch", FETCH)
    fetch.wait_started()
    parse = _step_worker(fenv, "parse", PARSE)
    parse.wait_started()
    [first] = fenv.start_runs(FLOW, 1)
    wait_until(lambda: fenv.started([first], "parse") == 1, "the parse task in flight")

    dry = fenv.cli("disable", "--flow", FLOW, "-m", "scrape v2", "--dry-run", "--format", "json")
    assert [f["function_name"] for f in json.loads(dry.stdout)["functions"]] == [FETCH, PARSE]  # every step's function

    disable = fenv.cli_background("disable", "--function", PARSE, "-m", "parser fix", "--heartbeat-window", WINDOW,
                                  "--interval", "0.1", "--timeout", "120", "--format", "json")
    parse.wait_for_line("stops polling and drains", "stderr")
    [second] = fenv.start_runs(FLOW, 1)  # fetch still runs; its parse task waits in the private queue
    wait_until(lambda: fenv.task_states([second]) == {("fetch", "completed"): 1, ("parse", "queued"): 1},
               "the second run's fetch to complete while parse is fenced")
    assert disable.popen.poll() is None and fenv.enabled(FETCH) is True

    fenv.release()
    result = disable.finish()
    assert result.code == 0, result.output
    drain = json.loads(result.stdout)["drain"]
    assert [(b["step_slug"], b["queued"]) for b in drain["backlog"]] == [("parse", 1)]
    assert parse.wait_exit() == 0 and fetch.popen.poll() is None

    restore = fenv.cli_background("restore", "--function", PARSE, "--wait-heartbeat", "--timeout", "120",
                                  "--heartbeat-window", WINDOW, "--interval", "0.1")
    wait_until(lambda: fenv.enabled(PARSE), "the restore")
    new_parse = _step_worker(fenv, "parse", PARSE)
    assert restore.finish().code == 0
    wait_until(lambda: fenv.task_states([first, second]) == {("fetch", "completed"): 2, ("parse", "completed"): 2},
               "both runs to finish")
    ran = _ran([fetch, parse, new_parse])
    assert sorted(ran) == sorted([(first, "fetch"), (first, "parse"), (second, "fetch"), (second, "parse")])

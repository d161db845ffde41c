"""A step-queued flow the per-step fence test serves with the real `pgflow worker MODULE:FLOW`.

``parse`` prints ``RAN <run_id> parse`` and blocks until $FENCE_GATE/<run_id> or $FENCE_GATE/all
exists; ``fetch`` returns at once.
"""

import os
import time
from pathlib import Path

from pgflow_cli.worker import Flow, with_step_queues


def fetch(run_input, ctx):
    print(f"RAN {ctx.run_id} fetch {ctx.task_index} {ctx.worker_id}", flush=True)
    return {"page": run_input}


def parse(deps, ctx):
    print(f"RAN {ctx.run_id} parse {ctx.task_index} {ctx.worker_id}", flush=True)
    gate = Path(os.environ["FENCE_GATE"])
    deadline = time.monotonic() + 300
    while not ((gate / ctx.run_id).exists() or (gate / "all").exists()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return {"parsed": deps["fetch"]}


steps = with_step_queues(Flow("fenceSteps").step("fetch", fetch).step("parse", parse, depends_on=["fetch"]))

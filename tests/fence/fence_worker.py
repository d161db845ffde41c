"""A reference worker process for the fence tests (a stand-in for `pgflow worker MODULE:FLOW`).

Usage: fence_worker.py CONNINFO FUNCTION_NAME FLOW_SLUG GATE_DIR [STEP_SLUG]

Serves :func:`tests.fence.helpers.gated_flow` for FLOW_SLUG with ``Worker.run()`` (SIGTERM and
SIGINT drain). The ``work`` handler prints ``RAN <run_id> work <task_index> <worker_id>`` and then
blocks until GATE_DIR/<run_id> or GATE_DIR/all exists; ``after`` prints its RAN line and returns.
With STEP_SLUG the worker serves only that step's private queue (a step-queued flow).

A refused start (fenced function, protocol or shape mismatch) prints ``REFUSED <message>`` and
``HINT <hint>`` on stderr and exits with the error's exit code, registering nothing. Otherwise
it prints ``EXIT <code> <stop reason>`` and exits with ``Worker.run()``'s code.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pgflow_cli.worker import Worker, WorkerOptions, WorkerStartupError  # noqa: E402
from tests.fence.helpers import HEARTBEAT_INTERVAL, gated_flow  # noqa: E402


def main() -> int:
    conninfo, function_name, flow_slug, gate = sys.argv[1:5]
    step_slug = sys.argv[5] if len(sys.argv) > 5 else None
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    worker_id = os.environ["FENCE_WORKER_ID"]
    worker = Worker(gated_flow(flow_slug, Path(gate)), conninfo, function_name=function_name, worker_id=worker_id,
                    step_slug=step_slug, options=WorkerOptions(
                        max_concurrent=4, batch_size=4, max_poll_seconds=1, poll_interval_ms=20,
                        heartbeat_interval=HEARTBEAT_INTERVAL, drain_timeout=120, application_name="pgflow-fence-test"))
    try:
        code = worker.run()
    except WorkerStartupError as exc:
        print(f"REFUSED {exc.message}", file=sys.stderr, flush=True)
        print(f"HINT {exc.hint}", file=sys.stderr, flush=True)
        return int(exc.exit_code)
    print(f"EXIT {code} {worker.stop_reason}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())

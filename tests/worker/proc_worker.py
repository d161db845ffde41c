"""A reference worker in its own process, for the kill and SIGTERM tests.

Usage: proc_worker.py CONNINFO FUNCTION_NAME WORKER_ID RELEASE_FILE

Serves tests/worker/flows.py ``procFlow`` with ``Worker.run()`` (SIGTERM/SIGINT drain).
The ``work`` handler prints ``STARTED <run_id> <pid>`` and then blocks until RELEASE_FILE
exists; ``after`` returns at once. Exit code: ``Worker.run()``'s.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pgflow_cli.worker import Worker, WorkerOptions  # noqa: E402
from tests.worker.flows import proc_flow  # noqa: E402


def main() -> int:
    conninfo, function_name, worker_id, release = sys.argv[1:5]
    release_file = Path(release)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")

    def work(value, ctx):
        print(f"STARTED {ctx.run_id} {os.getpid()}", flush=True)
        deadline = time.monotonic() + 300
        while not release_file.exists():
            if time.monotonic() > deadline:
                raise TimeoutError("release file never appeared")
            time.sleep(0.02)
        print(f"FINISHED {ctx.run_id} {os.getpid()}", flush=True)
        return {"by": "process", "pid": os.getpid()}

    def after(deps, ctx):
        return {"after": deps}

    worker = Worker(proc_flow(work, after), conninfo, function_name=function_name, worker_id=worker_id,
                    options=WorkerOptions(max_concurrent=2, batch_size=2, max_poll_seconds=1, poll_interval_ms=20,
                                          heartbeat_interval=0.3, drain_timeout=120,
                                          application_name="pgflow-worker-proc"))
    code = worker.run()
    print(f"EXIT {code} {worker.stop_reason}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())

"""``python -m examples.handlers --sandbox`` (or ``--dsn CONNINFO``): run the handler tour once.

Starts a reference worker for :data:`examples.handlers.tour.tour` in this process, starts one run,
waits until it has finished, prints every task (status, attempts, stored error) and the run's
output, stops the worker and exits 0 when the run completed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import psycopg
from psycopg.types.json import Jsonb

from examples.handlers.tour import RUN_INPUT, tour
from pgflow_cli.worker import Worker, WorkerOptions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.handlers", description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--sandbox", action="store_true", help="use the `pgflow sandbox up` database")
    where.add_argument("--dsn", help="libpq conninfo of a database with pgflow and PGMQ installed")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for the run")
    args = parser.parse_args(argv)
    if args.dsn:
        dsn = args.dsn
    else:
        from pgflow_cli.sandbox import Sandbox

        dsn = Sandbox.default().running_conninfo()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")

    worker = Worker(tour, dsn, function_name="handler-tour-worker",
                    options=WorkerOptions(max_concurrent=8, heartbeat_interval=1, max_poll_seconds=1))
    worker.start()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            run_id = conn.execute("SELECT run_id FROM pgflow.start_flow(%s, %s)",
                                  (tour.slug, Jsonb(RUN_INPUT))).fetchone()[0]  # type: ignore[index]
            deadline = time.monotonic() + args.timeout
            status = "started"
            while status == "started" and time.monotonic() < deadline:
                time.sleep(0.2)
                status = conn.execute("SELECT status FROM pgflow.runs WHERE run_id = %s",
                                      (run_id,)).fetchone()[0]  # type: ignore[index]
            for step, index, task_status, attempts, output, error in conn.execute(
                    "SELECT t.step_slug, t.task_index, t.status, t.attempts_count, t.output, t.error_message "
                    "FROM pgflow.step_tasks AS t JOIN pgflow.steps AS s USING (flow_slug, step_slug) "
                    "WHERE t.run_id = %s ORDER BY s.step_index, t.task_index", (run_id,)).fetchall():
                shown = f" -> {json.dumps(output, sort_keys=True)}" if output is not None else ""
                print(f"{step}[{index}]: {task_status} after {attempts} attempt(s){shown}"
                      + (f"; last error: {error}" if error else ""))
            output = conn.execute("SELECT output FROM pgflow.runs WHERE run_id = %s", (run_id,)).fetchone()[0]  # type: ignore[index]
            print(f"run {status}: {json.dumps(output, sort_keys=True)}")
    finally:
        worker.stop("tour done")
        worker.join(60)
    return 0 if status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())

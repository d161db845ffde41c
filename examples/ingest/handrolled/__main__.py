"""``python -m examples.ingest.handrolled run --sandbox --documents 50`` (or ``worker --stage S``)."""

from __future__ import annotations

import logging
import sys
import time

import psycopg

from examples.ingest import common, domain
from examples.ingest.handrolled import app


def main(argv: list[str] | None = None) -> int:
    top, commands = common.parser("python -m examples.ingest.handrolled", "Hand-rolled PGMQ ingestion")
    worker = commands.add_parser("worker", help="serve one stage (used by run)")
    worker.add_argument("--stage", choices=domain.STAGES, required=True)
    worker.add_argument("--dsn", required=True)
    worker.add_argument("--concurrency", type=int, default=4)
    args = top.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.command == "worker":
        app.serve(args.stage, args.dsn, args.concurrency)
        return 0
    dsn = common.resolve_dsn(args)
    with psycopg.connect(dsn, autocommit=True) as conn:
        app.setup(conn)
        conn.execute("TRUNCATE ingest.documents, ingest.index_terms, ingest.stage_calls, ingest.stage_effects, "
                     "ingest.faults")
        for queue in app.QUEUES.values():
            conn.execute("SELECT pgmq.purge_queue(%s)", (queue,))
        started = time.monotonic()
        app.submit(conn, domain.sample_documents(args.documents))
    pools = [common.spawn(["-m", "examples.ingest.handrolled", "worker", "--stage", stage, "--dsn", dsn], dsn)
             for stage in domain.STAGES for _ in range(args.workers_per_step)]
    try:
        finished = common.wait_terminal(dsn, args.timeout)
    finally:
        common.stop(pools)
    return common.report(dsn, started, finished)


if __name__ == "__main__":
    sys.exit(main())

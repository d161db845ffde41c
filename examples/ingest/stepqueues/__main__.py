"""``python -m examples.ingest.stepqueues run --sandbox --documents 50``."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import psycopg

from examples.ingest import common, domain
from examples.ingest.stepqueues import app
from examples.ingest.stepqueues.flow import ingest
from pgflow_cli.client import Client, WaitTimeout

TARGET = "examples.ingest.stepqueues.flow:ingest"


def main(argv: list[str] | None = None) -> int:
    top, _ = common.parser("python -m examples.ingest.stepqueues", "Step-queued pgflow ingestion")
    args = top.parse_args(argv)
    dsn = common.resolve_dsn(args)
    with psycopg.connect(dsn, autocommit=True) as conn:
        app.setup(conn)
        conn.execute("TRUNCATE ingest.documents, ingest.index_terms, ingest.stage_calls, ingest.stage_effects, "
                     "ingest.faults")
    pools = [common.spawn(["-m", "pgflow_cli", "worker", TARGET, "--step", step, "--dsn", dsn, "--concurrency", "4"], dsn)
             for step in ingest.step_slugs for _ in range(args.workers_per_step)]
    try:
        gate = subprocess.run([sys.executable, "-m", "pgflow_cli", "coverage", "--flow", ingest.slug, "--dsn", dsn,
                               "--wait", "--timeout", "60"], env=common.child_env(dsn), stdout=subprocess.DEVNULL)
        if gate.returncode != 0:
            print("error: the step workers did not cover every step", file=sys.stderr)
            return 1
        started = time.monotonic()
        with psycopg.connect(dsn, autocommit=True) as conn, Client(dsn) as client:
            submitted = app.submit(conn, domain.sample_documents(args.documents))
            with contextlib.suppress(WaitTimeout):  # the report below counts what is still pending
                app.settle(client, submitted, timeout=args.timeout)
            finished = domain.pending_count(conn) == 0
    finally:
        common.stop(pools)
    return common.report(dsn, started, finished)


if __name__ == "__main__":
    sys.exit(main())

"""Several reference Worker instances on one flow: every task is run exactly once.

Every handler invocation is recorded with (run_id, step_slug, task_index, worker); the record
is compared with ``pgflow.step_tasks`` (status, attempts_count, last_worker_id) and with the
flow's PGMQ queue and archive. Each case runs with one report call per task and with batched
reports (``complete_tasks``, the queue stage), and with the workers connected to the server directly
and through a real PgBouncer in transaction mode (strict: every server connection is reset after each
transaction, so a worker that relied on session state would fail every time).
"""

from __future__ import annotations

import contextlib
import threading

import pytest

from tests.worker.batch import ensure_batch_functions
from tests.worker.flows import diamond_map_flow
from tests.worker.helpers import assert_each_task_ran_exactly_once, wait_until


@pytest.mark.parametrize("via", ["direct", "pgbouncer"])
@pytest.mark.parametrize("reports", ["one call per task", "batched"])
@pytest.mark.parametrize("n_workers", [2, 4])
def test_concurrent_workers_run_every_task_exactly_once(env, n_workers, reports, via, request):
    batched = reports == "batched"
    if via == "pgbouncer":
        env.conninfo = request.getfixturevalue("pooled").conninfo  # the workers' connections, not the test's
    if batched:
        ensure_batch_functions(env)
    rec = env.recorder
    opened = threading.Event()

    def gate():
        # The first seed tasks wait until every worker has started a handler, so all of them
        # demonstrably compete for the same queue (bounded: a stuck gate only fails the assertion below).
        if not opened.is_set():
            with contextlib.suppress(AssertionError):
                wait_until(lambda: len(rec.worker_ids()) >= n_workers, "every worker to run a handler", timeout=60)
            opened.set()

    flow = diamond_map_flow("concFlow", rec, gate)
    workers = [env.worker(flow, function_name="conc-worker", max_concurrent=2, batch_size=2, batch_reports=batched)
               for _ in range(n_workers)]
    for worker in workers:
        worker.start()  # the first start compiles the flow, the others verify it
    assert [w.reports_batched for w in workers] == [batched] * n_workers
    run_ids = env.start_runs("concFlow", [{"n": i % 4} for i in range(40)])  # maps of 0..3 elements
    finished = env.wait_runs_finished(run_ids)

    assert {r["status"] for r in finished} == {"completed"}
    for r in finished:
        n = r["input"]["n"]
        assert r["output"] == {"join": {"sum": sum(i * 2 for i in range(n)), "n": n}}
    assert rec.worker_ids() == {w.worker_id for w in workers}, "not every worker took part"
    total = assert_each_task_ran_exactly_once(env, run_ids, workers)
    assert total == sum(3 + i % 4 for i in range(40))
    env.stop_workers()
    live, archived = env.queue_totals()[workers[0].queue_name]
    assert (live, archived) == (0, total)
    rows = env.rows("SELECT worker_id::text AS id, stopped_at FROM pgflow.workers WHERE function_name = 'conc-worker'")
    assert {r["id"] for r in rows} == {w.worker_id for w in workers} and all(r["stopped_at"] for r in rows)

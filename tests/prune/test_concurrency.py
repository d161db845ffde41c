"""Pruning beside real sessions: a late report holding a finished run, a worker claiming, a run
finishing while the prune runs, and workers draining a live flow throughout. The prune never waits
for any of them (its lock timeout is 0.1 s and it gets one attempt, so a wait fails the test), and
none of them sees an error."""

from __future__ import annotations

import functools
import threading

from psycopg.types.json import Jsonb

from pgflow_cli.operations import prune as op
from tests.dropflow.test_concurrency import WorkerThread
from tests.prune.helpers import CUTOFF_DAYS, age_run, build_history
from tests.worker.helpers import wait_until

DAYS = CUTOFF_DAYS * 86400.0
DEADLINE = 60.0
_wait_for = functools.partial(wait_until, timeout=DEADLINE, interval=0.01)


def never_waiting(db, **options) -> op.PruneReport:
    """A prune on its own connection that fails (LockTimeout) if any batch waits 0.1 s for a lock."""
    with db.connect() as conn:
        return op.prune(conn, older_than=DAYS, lock_timeout=0.1, attempts=1, **options)


def test_a_finished_run_a_late_report_holds_is_skipped_then_pruned_next_time(rt, db):
    history = build_history(rt)
    held = history.gone[0]
    late = db.connect(autocommit=False)
    late.execute("SELECT * FROM pgflow.complete_task(%s, 'a', 0, %s)", (held, Jsonb("late")))  # locks the run
    report = never_waiting(db, batch_size=1)
    assert report.totals.skipped_locked == 1 and report.totals.runs == len(history.gone) - 1
    assert rt.val("SELECT count(*) FROM pgflow.runs WHERE run_id = %s", (held,)) == 1
    late.commit()  # the late report finds a finished run: nothing changes
    again = never_waiting(db)
    assert (again.totals.runs, again.totals.skipped_locked) == (1, 0)
    assert rt.val("SELECT count(*) FROM pgflow.runs WHERE run_id = %s", (held,)) == 0


def test_a_worker_claiming_and_a_run_finishing_during_the_prune_neither_wait_nor_are_touched(rt, db):
    history = build_history(rt)
    rt.flow("quick", [{"slug": "only"}])
    finishing = rt.start("quick", {})
    [task] = rt.poll("quick")
    age_run(rt, finishing)
    claimer = db.connect(autocommit=False)
    finisher = db.connect(autocommit=False)
    started = rt.start("orders", {"s": 1})
    age_run(rt, started)
    msg = rt.task(started, "a")["message_id"]
    rt.conn.execute("SELECT pgmq.set_vt('orders', %s, 0)", (msg,))
    worker = rt.worker_for("orders")
    # a claim in flight: its run FOR SHARE, its task started, its message's visibility moved
    claimed = claimer.execute("SELECT outcome FROM pgflow.claim_tasks('orders', %s::bigint[], %s, 'orders')",
                              ([msg], worker)).fetchall()
    assert claimed == [("claimed",)]
    # a run finishing: its last task completing, its run FOR UPDATE and completed, not yet committed
    finisher.execute("SELECT * FROM pgflow.complete_task(%s, 'only', 0, %s)", (finishing, Jsonb(1)))
    report = never_waiting(db, batch_size=2)
    assert report.totals.runs == len(history.gone) and report.totals.skipped_locked == 0
    claimer.commit()
    finisher.commit()
    assert rt.run(started)["status"] == "started" and rt.task(started, "a")["status"] == "started"
    assert rt.run(finishing)["status"] == "completed"
    rt.complete(started, "a", 0, 1)
    rt.complete(history.in_flight, "a", 0, 1)
    for run_id in (started, history.in_flight):
        (task,) = rt.claim("orders", [rt.task(run_id, "b")["message_id"]])
        rt.complete(run_id, "b", 0, 2)
        assert rt.run(run_id)["status"] == "completed"
    # they finished today: the next prune keeps them
    assert never_waiting(db).totals.runs == 0
    assert rt.val("SELECT count(*) FROM pgflow.runs WHERE run_id = ANY (%s)", ([started, finishing, history.in_flight],)) == 3


def test_pruning_beside_workers_draining_a_live_flow(rt, db):
    rt.flow("live", [{"slug": "a"}, {"slug": "b", "deps": ["a"]}])
    old = [rt.start("live", {"i": i}) for i in range(60)]
    rt.drive("live", lambda task: 1)
    for run_id in old:
        age_run(rt, run_id)
    fresh = [rt.start("live", {"n": i}) for i in range(60)]
    stop = threading.Event()
    workers = [WorkerThread(db, "live", stop) for _ in range(3)]
    for w in workers:
        w.start()
    try:
        _wait_for(lambda: sum(w.completed for w in workers) >= 10, "the workers to complete some tasks")
        report = never_waiting(db, batch_size=5)
        _wait_for(lambda: all(rt.run(r)["status"] == "completed" for r in fresh), "the live runs to complete")
    finally:
        stop.set()
        for w in workers:
            w.join(DEADLINE)
    assert [e for w in workers for e in w.errors] == []
    assert report.totals.runs == 60 and report.totals.skipped_locked == 0
    assert rt.val("SELECT count(*) FROM pgflow.runs WHERE run_id = ANY (%s)", (old,)) == 0
    assert rt.val("SELECT count(*) FROM pgflow.runs") == 60

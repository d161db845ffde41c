"""Whole-flow deletion against real concurrent sessions: workers claiming and completing tasks on
several connections, a second deletion of the same flow. No deadlock; a clean result either way."""

from __future__ import annotations

import functools
import threading
import time
import uuid

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from tests.dropflow.helpers import assert_gone, drop
from tests.runtime.driver import wait_until_blocked
from tests.worker.helpers import wait_until

DEADLINE = 60.0
_wait_for = functools.partial(wait_until, timeout=DEADLINE, interval=0.01)
"""Seconds before a wait fails the test (a hang guard, never a speed claim)."""


class WorkerThread(threading.Thread):
    """A protocol-2 worker on its own connection: read (autocommit), claim, complete, repeat.

    It stops when told to, or at the first database error once the flow is gone; every error is
    kept with its SQLSTATE so the test can tell "the flow was deleted under me" from a deadlock.
    """

    def __init__(self, db, flow: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.conn = db.connect()
        self.conn.row_factory = dict_row
        self.flow = flow
        self.queue = flow.lower()
        self.stop = stop
        self.worker_id = uuid.uuid4()
        self.conn.execute("SELECT pgflow.register_worker(%s, %s, %s, %s)",
                          (self.worker_id, f"fn-{flow}", self.queue, flow))
        self.completed = 0
        self.errors: list[tuple[str | None, str]] = []
        self.outcomes: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                msgs = self.conn.execute("SELECT msg_id FROM pgmq.read(%s, 30, 5)", (self.queue,)).fetchall()
                if not msgs:
                    time.sleep(0.005)  # an idle worker's poll interval, not a test wait
                    continue
                with self.conn.transaction():
                    rows = self.conn.execute(
                        "SELECT * FROM pgflow.claim_tasks(%s, %s::bigint[], %s, %s)",
                        (self.queue, [m["msg_id"] for m in msgs], self.worker_id, self.flow)).fetchall()
                self.outcomes.extend(r["outcome"] for r in rows)
                for r in rows:
                    if r["outcome"] == "claimed":
                        done = self.conn.execute("SELECT * FROM pgflow.complete_task(%s, %s, %s, %s)",
                                                 (r["run_id"], r["step_slug"], r["task_index"], Jsonb("ok"))).fetchall()
                        self.completed += len(done)
                if any(r["outcome"] == "fatal" for r in rows):
                    return
            except psycopg.Error as exc:
                self.errors.append((exc.sqlstate, str(exc).splitlines()[0]))
                return


def test_deletion_while_workers_claim_and_complete(rt, db):
    rt.flow("Doomed", [{"slug": "a"}, {"slug": "b", "deps": ["a"]}, {"slug": "c", "deps": ["b"]}])
    rt.flow("survivor", [{"slug": "a"}])
    for i in range(150):
        rt.start("Doomed", {"i": i})
    kept = [rt.start("survivor", {"i": i}) for i in range(20)]
    stop = threading.Event()
    workers = [WorkerThread(db, "Doomed", stop) for _ in range(3)]
    bystander = WorkerThread(db, "survivor", stop)
    for w in workers + [bystander]:
        w.start()
    try:
        _wait_for(lambda: sum(w.completed for w in workers) >= 30, "the workers to complete some tasks")
        result = drop(rt, "Doomed", force=True)
        _wait_for(lambda: all(c["status"] == "completed" for c in (rt.run(k) for k in kept)), "the survivor's runs")
    finally:
        stop.set()
        for w in workers + [bystander]:
            w.join(DEADLINE)
    assert not any(w.is_alive() for w in workers + [bystander])
    assert result["deleted"]["runs"] == 150 and result["queues"][0]["outcome"] == "dropped"
    assert_gone(rt, "Doomed", ["doomed"])
    errors = [e for w in workers for e in w.errors]
    assert not [e for e in errors if e[0] == "40P01"], errors  # never a deadlock
    # after the commit a worker finds the queue gone (42P01) or its claim classifies nothing to claim
    assert {e[0] for e in errors} <= {"42P01"}, errors
    assert bystander.errors == [] and bystander.completed == 20


def test_two_concurrent_drops_of_the_same_flow(rt, db):
    rt.flow("twice", [{"slug": "a"}])
    for i in range(20):
        rt.start("twice", {"i": i})
    holder = db.connect(autocommit=False)
    holder.execute("SELECT 1 FROM pgflow.runs WHERE flow_slug = 'twice' LIMIT 1 FOR SHARE")  # a claim in flight
    results: dict[int, object] = {}

    def attempt(n: int) -> None:
        conn = db.connect()
        try:
            results[n] = drop(rt, "twice", force=True, conn=conn)
        except psycopg.Error as exc:
            results[n] = exc

    threads = [threading.Thread(target=attempt, args=(n,)) for n in (1, 2)]
    threads[0].start()
    # the first waits for the claim's run lock, the second for the first one's flow lock
    _wait_for(lambda: rt.val("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                             "AND wait_event_type = 'Lock' AND query LIKE 'SELECT pgflow.drop_flow%%'") == 1, "the first drop to wait")
    threads[1].start()
    _wait_for(lambda: rt.val("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                             "AND wait_event_type = 'Lock' AND query LIKE 'SELECT pgflow.drop_flow%%'") == 2, "both drops to wait")
    holder.commit()
    for t in threads:
        t.join(DEADLINE)
    outcomes = sorted((type(r).__name__, getattr(r, "sqlstate", None)) for r in results.values())
    assert len(outcomes) == 2
    ok = [r for r in results.values() if isinstance(r, dict)]
    failed = [r for r in results.values() if isinstance(r, psycopg.Error)]
    assert len(ok) == 1 and ok[0]["deleted"]["runs"] == 20, outcomes
    assert [e.sqlstate for e in failed] == ["PF006"], outcomes  # the second finds nothing left to delete
    assert_gone(rt, "twice", ["twice"])


def test_deletion_waits_for_a_completion_in_flight_and_the_late_report_finds_nothing(rt, db):
    rt.flow("late", [{"slug": "a"}, {"slug": "b", "deps": ["a"]}])
    run = rt.start("late", {})
    [task] = rt.poll("late")
    reporter = db.connect(autocommit=False)
    reporter.execute("SELECT * FROM pgflow.complete_task(%s, 'a', 0, %s)", (run, Jsonb("done")))  # holds the run
    deleter = db.connect()
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(r=drop(rt, "late", force=True, conn=deleter)))
    thread.start()
    assert reporter.info.backend_pid in wait_until_blocked(rt.conn, deleter.info.backend_pid)
    # it waits on a row of the run, holding nothing of the queue yet
    held = rt.rows("SELECT relation::regclass::text AS rel FROM pg_locks WHERE pid = %s AND granted AND relation IS NOT NULL",
                   (deleter.info.backend_pid,))
    assert not [h for h in held if (h["rel"] or "").startswith("pgmq.")], held
    reporter.commit()  # b's message was sent into the queue the deletion is about to drop
    thread.join(DEADLINE)
    assert box["r"]["deleted"] == {"step_tasks": 2, "step_states": 2, "runs": 1, "deps": 1, "steps": 2, "flows": 1, "workers": 0}
    assert box["r"]["queues"][0]["messages"] == 1
    assert rt.complete(run, "b", 0, "late") is None
    assert_gone(rt, "late", ["late"])

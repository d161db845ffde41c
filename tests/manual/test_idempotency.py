"""The idempotency table of docs/manual-tasks.md, one call after another and racing from several
real connections: nothing progresses twice, no finished run is revived, and approvals of other
runs or other task indexes are isolated."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgflow_cli.worker.flow import Flow
from tests.runtime.driver import raises_sqlstate, wait_until_blocked

COMPLETE = "SELECT * FROM pgflow.complete_manual_task(%s, %s, %s, %s)"
FAIL = "SELECT * FROM pgflow.fail_manual_task(%s, %s, %s, %s)"


def call(conn, kind: str, run, step: str, index: int, value):
    if kind == "complete":
        return conn.execute(COMPLETE, (run, step, index, Jsonb(value))).fetchone()
    return conn.execute(FAIL, (run, step, index, value)).fetchone()


@pytest.fixture
def gate(rt, author):
    """A flow ``gate`` -> ``after`` (queue-backed) and one started run."""
    author(Flow("approval").step("gate", manual=True).step("after", lambda i, c: i, depends_on=["gate"]))
    return rt.start("approval", {})


@pytest.mark.parametrize(
    ("first", "second", "outcome"),
    [
        (("complete", {"ok": 1}), ("complete", {"ok": 1}), "stored"),
        (("complete", {"a": 1, "b": [1, 2]}), ("complete", {"b": [1, 2], "a": 1}), "stored"),  # equal JSON
        (("complete", {"ok": 1}), ("complete", {"ok": 2}), "PF012"),
        (("fail", "rejected"), ("fail", "rejected"), "stored"),
        (("fail", "rejected"), ("fail", "rejected twice"), "PF012"),
        (("complete", {"ok": 1}), ("fail", "rejected"), "PF012"),
        (("fail", "rejected"), ("complete", {"ok": 1}), "PF012"),
    ],
)
def test_the_idempotency_table(rt, gate, first, second, outcome):
    stored = call(rt.conn, first[0], gate, "gate", 0, first[1])
    before = (rt.run(gate), rt.steps(gate), rt.tasks(gate))
    if outcome == "stored":
        assert call(rt.conn, second[0], gate, "gate", 0, second[1]) == stored
    else:
        with raises_sqlstate(outcome, "already"):
            call(rt.conn, second[0], gate, "gate", 0, second[1])
    assert (rt.run(gate), rt.steps(gate), rt.tasks(gate)) == before  # nothing moved


def test_not_found_and_not_active_codes(rt, gate, author):
    with raises_sqlstate("PF009", "run does not exist"):
        call(rt.conn, "complete", uuid.uuid4(), "gate", 0, 1)
    with raises_sqlstate("PF009", "no such step"):
        call(rt.conn, "complete", gate, "nope", 0, 1)
    with raises_sqlstate("PF009", "no task with that index"):
        call(rt.conn, "complete", gate, "gate", 1, 1)
    author(Flow("later").step("work", lambda i, c: i).step("gate", manual=True, depends_on=["work"]))
    later = rt.start("later", {})
    with raises_sqlstate("PF009", "has not started yet"):
        call(rt.conn, "complete", later, "gate", 0, 1)
    with raises_sqlstate("22004"):
        call(rt.conn, "fail", gate, "gate", 0, None)

    # a task cancelled with its run is no longer active, whatever is asked
    author(Flow("pair").step("gate", manual=True).step("other", manual=True))
    run = rt.start("pair", {})
    call(rt.conn, "fail", run, "other", 0, "no")
    for kind, value in (("complete", 1), ("fail", "late")):
        with raises_sqlstate("PF011", "no longer active"):
            call(rt.conn, kind, run, "gate", 0, value)
    assert rt.run(run)["status"] == "failed" and rt.task(run, "gate")["status"] == "cancelled"


def _blocked_calls(db, observer, calls):
    """Start each ``(kind, run, step, index, value)`` on its own connection, wait until every one
    waits for a lock; return the futures (results: the task row or the psycopg error)."""
    pool = ThreadPoolExecutor(len(calls))
    conns = [db.connect() for _ in calls]
    for conn in conns:
        conn.row_factory = dict_row

    def run(conn, spec):
        try:
            return call(conn, *spec)
        except psycopg.Error as exc:
            return exc

    futures = [pool.submit(run, conn, spec) for conn, spec in zip(conns, calls, strict=True)]
    for conn in conns:
        wait_until_blocked(observer, conn.info.backend_pid)
    pool.shutdown(wait=False)
    return futures


def test_duplicate_and_conflicting_completions_racing_progress_once(rt, db, gate):
    first = db.connect(autocommit=False)
    first.row_factory = dict_row
    stored = call(first, "complete", gate, "gate", 0, {"ok": 1})  # holds the run lock, uncommitted
    racing = _blocked_calls(db, rt.conn, [
        ("complete", gate, "gate", 0, {"ok": 1}),
        ("complete", gate, "gate", 0, {"ok": 1}),
        ("complete", gate, "gate", 0, {"ok": 2}),
        ("fail", gate, "gate", 0, "rejected"),
    ])
    first.commit()
    results = [f.result(timeout=30) for f in racing]
    assert results[0] == stored and results[1] == stored
    assert [getattr(r, "sqlstate", None) for r in results[2:]] == ["PF012", "PF012"]
    # progressed exactly once: one task for the child, one message, one step fewer
    assert len(rt.tasks(gate, "after")) == 1
    assert len(rt.read("approval")) == 1
    assert rt.run(gate)["remaining_steps"] == 1


def test_a_late_call_after_the_run_failed_never_revives_it(rt, db, author):
    author(Flow("strict").map("each", manual=True))
    run = rt.start("strict", ["a", "b", "c"])
    call(rt.conn, "complete", run, "each", 2, "done")
    failing = db.connect(autocommit=False)
    call(failing, "fail", run, "each", 0, "rejected")  # when_exhausted = fail; uncommitted
    racing = _blocked_calls(db, rt.conn, [
        ("complete", run, "each", 1, "approved"),
        ("fail", run, "each", 1, "also rejected"),
        ("complete", run, "each", 2, "done"),  # a repeat of the earlier completion
    ])
    failing.commit()
    results = [f.result(timeout=30) for f in racing]
    assert [getattr(r, "sqlstate", None) for r in results[:2]] == ["PF011", "PF011"]
    assert results[2]["status"] == "completed"
    assert rt.run(run)["status"] == "failed"
    assert [t["status"] for t in rt.tasks(run)] == ["failed", "cancelled", "completed"]
    assert rt.steps(run)["each"]["status"] == "failed"


def test_a_late_call_after_the_run_completed_changes_nothing(rt, author):
    author(Flow("done").step("gate", manual=True))
    run = rt.start("done", {})
    call(rt.conn, "complete", run, "gate", 0, "yes")
    finished = rt.run(run)
    assert finished["status"] == "completed"
    with raises_sqlstate("PF012"):
        call(rt.conn, "fail", run, "gate", 0, "too late")
    assert call(rt.conn, "complete", run, "gate", 0, "yes")["status"] == "completed"
    assert rt.run(run) == finished


def test_approvals_of_different_runs_do_not_wait_for_each_other(rt, db, author):
    author(Flow("parallel").step("gate", manual=True))
    one, two = rt.start("parallel", {}), rt.start("parallel", {})
    a = db.connect(autocommit=False)
    b = db.connect(autocommit=False)
    b.execute("SET lock_timeout = '5s'")  # would fail here if run two waited for run one
    call(a, "complete", one, "gate", 0, "one")
    call(b, "complete", two, "gate", 0, "two")
    b.commit()
    assert rt.run(two)["status"] == "completed" and rt.run(one)["status"] == "started"
    a.commit()
    assert rt.run(one)["output"] == {"gate": "one"} and rt.run(two)["output"] == {"gate": "two"}


def test_approvals_of_different_indexes_of_one_run_take_turns_and_aggregate_in_order(rt, db, author):
    author(Flow("fanout").map("each", manual=True).step("sum", lambda i, c: i, depends_on=["each"]))
    run = rt.start("fanout", [10, 20, 30])
    a = db.connect(autocommit=False)
    call(a, "complete", run, "each", 1, 21)
    racing = _blocked_calls(db, rt.conn, [("complete", run, "each", 2, 32), ("complete", run, "each", 0, 10)])
    a.commit()
    assert [f.result(timeout=30)["status"] for f in racing] == ["completed", "completed"]
    assert rt.steps(run)["each"]["output"] == [10, 21, 32]
    assert len(rt.tasks(run, "sum")) == 1 and len(rt.read("fanout")) == 1

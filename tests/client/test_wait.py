"""Awaiting runs with pgflow_cli.client: outputs, failures with their messages, deadlines, progress,
many waits sharing one statement per look, sync and asyncio. Runs are moved by real workers or held
by a manual step that the test completes, so no test depends on how long anything takes."""

from __future__ import annotations

import asyncio
import threading
import uuid

import psycopg
import pytest

from pgflow_cli.client import (
    AsyncClient,
    Client,
    PollPolicy,
    RunFailed,
    RunNotFound,
    WaitTimeout,
    start_runs,
)
from pgflow_cli.client.core import WaitBook
from pgflow_cli.errors import ExitCode
from tests.client.flows import approval, approve, compile_flows, failing, greet, held, strict

FAST = PollPolicy(first_interval=0.02, factor=1.5, max_interval=0.2)


def test_wait_returns_the_runs_output(db, start_worker):
    start_worker(greet)
    with Client(db.conninfo, poll=FAST) as pgflow:
        output = pgflow.run(greet, {"first": "Ada", "last": "Lovelace"}, timeout=60)
        assert output == {"greeting": "Hello, Ada Lovelace!"}
        run = pgflow.start("greetUser", {"first": "Grace", "last": "Hopper"})
        outcome = pgflow.outcome(run, timeout=60)
    assert outcome.ok and outcome.result() == {"greeting": "Hello, Grace Hopper!"}
    assert outcome.remaining_steps == 0 and outcome.ended_at >= outcome.started_at


def test_a_failed_run_raises_with_its_failed_steps_and_their_messages(db, start_worker):
    start_worker(failing)
    with Client(db.conninfo, poll=FAST) as pgflow:
        run = pgflow.start(failing, {})
        with pytest.raises(RunFailed) as failed:
            pgflow.wait(run, timeout=60)
    error = failed.value
    assert error.exit_code == ExitCode.FINDINGS
    [step] = error.failures
    assert step.step_slug == "boom"
    [task] = step.tasks
    assert task.task_index == 0 and task.attempts_count == 2
    assert task.error_message.startswith("ValueError: boom on attempt for run " + run.run_id[:8])
    assert error.detail == [step.describe()] and "boom" in error.detail[0] and "2 attempt(s)" in error.detail[0]
    assert error.outcome.output is None and not error.outcome.ok


def test_a_step_that_failed_without_a_task_is_reported_with_its_own_error(db):
    compile_flows(db.conninfo, strict)
    with Client(db.conninfo, poll=FAST) as pgflow:
        outcome = pgflow.outcome(pgflow.start(strict, {"go": False}), timeout=30)
    [step] = outcome.failures
    assert (outcome.status, step.step_slug, step.tasks) == ("failed", "gate", ())
    assert step.error_message and "condition" in step.error_message.lower()


def test_the_deadline_leaves_the_run_going_and_a_later_wait_gets_it(db, start_worker):
    start_worker(held)
    with Client(db.conninfo, poll=FAST) as pgflow:
        run = pgflow.start(held, {})
        with pytest.raises(WaitTimeout) as late:
            pgflow.wait(run, timeout=0.3)
        assert late.value.exit_code == ExitCode.DEADLINE
        assert late.value.progress.status == "started" and late.value.progress.remaining_steps == 2
        assert f"pgflow runs wait {run.run_id}" in late.value.hint
        approve(db.conninfo, run.run_id, "approved")
        assert pgflow.wait(run, timeout=60) == {"after": "approved"}


def test_progress_is_reported_while_the_run_goes_on(db):
    compile_flows(db.conninfo, held)
    seen = []
    with Client(db.conninfo, poll=FAST) as pgflow:
        run = pgflow.start(held, {})
        with pytest.raises(WaitTimeout):
            pgflow.outcome(run, timeout=1.0, on_progress=seen.append, progress_every=0.1)
    assert seen and {p.status for p in seen} == {"started"} and {p.run_id for p in seen} == {run.run_id}


def test_an_unknown_run_and_a_run_deleted_while_awaited_are_run_not_found(db):
    compile_flows(db.conninfo, held)
    with Client(db.conninfo, poll=FAST) as pgflow:
        with pytest.raises(RunNotFound) as missing:
            pgflow.wait(uuid.uuid4(), timeout=30)
        assert missing.value.exit_code == ExitCode.CONFLICT
        run = pgflow.start(held, {})
        waiting = threading.Thread(target=lambda: errors.append(_wait_error(pgflow, run)))
        errors: list[BaseException | None] = []
        waiting.start()
        _until(lambda: pgflow.stats.polls >= 1)
        with psycopg.connect(db.conninfo) as conn:  # as pruning deletes a run's rows
            for table in ("step_tasks", "step_states", "runs"):
                conn.execute(f"DELETE FROM pgflow.{table} WHERE run_id = %s", (run.run_id,))
        waiting.join(60)
    assert isinstance(errors[0], RunNotFound)


def _wait_error(pgflow: Client, run) -> BaseException | None:
    try:
        pgflow.wait(run, timeout=60)
    except BaseException as exc:  # the test inspects it
        return exc
    return None


def _until(condition, deadline: float = 60.0) -> None:
    """Wait for a state (a hang guard, not a timing claim)."""
    import time

    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, "the state was not reached"
        time.sleep(0.01)


def test_many_awaited_runs_cost_far_fewer_statements_than_runs(db, start_worker):
    compile_flows(db.conninfo, held)
    conn = db.connect()
    runs = start_runs(conn, held, [{} for _ in range(200)])
    with Client(db.conninfo, poll=FAST) as pgflow:
        outcomes: list = []
        waiter = threading.Thread(target=lambda: outcomes.extend(pgflow.wait_all(runs, timeout=120)))
        waiter.start()
        _until(lambda: pgflow.stats.polls >= 2)
        conn.execute("SELECT pgflow.complete_manual_task(run_id, 'approve', 0, to_jsonb(run_id::text)) "
                     "FROM pgflow.runs WHERE flow_slug = 'held'")
        start_worker(held)
        waiter.join(120)
        stats = pgflow.stats
    assert [o.run_id for o in outcomes] == [r.run_id for r in runs]
    assert all(o.ok and o.output == {"after": o.run_id} for o in outcomes)
    assert stats.polls < len(runs) / 4, stats  # one statement reads every run due
    assert stats.runs_read / stats.polls > 10, stats


def test_as_completed_yields_each_outcome_when_its_run_ends(db):
    """Three runs end in the order the test chooses (2, 0, 1): each is yielded before the next is ended."""
    compile_flows(db.conninfo, approval, strict)
    conn = db.connect()
    runs = start_runs(conn, approval, [{}, {}, {}])
    ends = [2, 0, 1]  # run k is completed with output k
    order = []
    with Client(db.conninfo, poll=FAST) as pgflow:
        approve(db.conninfo, runs[ends[0]].run_id, ends[0])
        for outcome in pgflow.as_completed(runs, timeout=60):
            order.append(outcome.output["approve"])
            if len(order) < len(ends):
                approve(db.conninfo, runs[ends[len(order)]].run_id, ends[len(order)])
        with pytest.raises(WaitTimeout) as late:
            list(pgflow.as_completed([pgflow.start(approval, {}), pgflow.start(strict, {})], timeout=0.5))
    assert order == [2, 0, 1]
    assert late.value.run_id not in {r.run_id for r in runs}


def test_asyncio_as_completed_yields_in_the_order_runs_end(db):
    compile_flows(db.conninfo, approval)

    async def scenario() -> list[int]:
        async with AsyncClient(db.conninfo, poll=FAST) as pgflow:
            runs = await pgflow.start_many(approval, [{}, {}])
            approve(db.conninfo, runs[1].run_id, 1)
            seen = []
            async for outcome in pgflow.as_completed(runs, timeout=60):
                seen.append(outcome.output["approve"])
                if len(seen) == 1:
                    approve(db.conninfo, runs[0].run_id, 0)
            return seen

    assert asyncio.run(scenario()) == [1, 0]


def test_asyncio_waits_share_one_task_and_one_connection(db, start_worker):
    start_worker(greet)
    start_worker(failing)

    async def scenario():
        async with AsyncClient(db.conninfo, poll=FAST) as pgflow:
            runs = await pgflow.start_many(greet, [{"first": str(i), "last": "x"} for i in range(100)])
            bad = await pgflow.start(failing, {})
            outputs = await asyncio.gather(*(pgflow.wait(run, timeout=120) for run in runs))
            with pytest.raises(RunFailed) as failed:
                await pgflow.wait(bad, timeout=120)
            with pytest.raises(WaitTimeout):
                await pgflow.wait((await pgflow.start("greetUser", {"first": "slow", "last": "x"})), timeout=0)
            return outputs, failed.value, pgflow.stats

    outputs, failed, stats = asyncio.run(scenario())
    assert outputs == [{"greeting": f"Hello, {i} x!"} for i in range(100)]
    assert failed.failures[0].step_slug == "boom"
    assert stats.polls < 100 and stats.runs_read / stats.polls > 5, stats


def test_the_wait_book_looks_less_often_and_groups_what_is_due():
    """The backoff rule itself: intervals grow by the factor up to the cap; a run due soon rides along
    with one due now; two statements are at least first_interval apart."""
    import datetime as dt

    book = WaitBook(PollPolicy(first_interval=0.1, factor=2.0, max_interval=0.4))
    wall = dt.datetime.now(dt.timezone.utc)

    def look(now: float) -> list[str]:
        due = book.due(now)
        book.record(due, [{"run_id": r, "status": "started", "remaining_steps": 1} for r in due], now, wall)
        return due

    book.add("a", 0.0)
    times = []
    for _ in range(5):
        times.append(book.next_wake())
        assert look(times[-1]) == ["a"]
    assert times == pytest.approx([0.0, 0.2, 0.6, 1.0, 1.4])  # 0.1 doubled, then capped at 0.4
    book.add("b", 1.75)  # 'a' is due at 1.8: within a quarter of its interval
    assert book.next_wake() == pytest.approx(1.75)
    assert look(1.75) == ["a", "b"]
    book.add("c", 1.76)  # due at once, but the last statement was 0.01 s ago
    assert book.next_wake() == pytest.approx(1.85)
    book.record(["c"], [], 1.85, wall)  # no row: the run is gone
    assert len(book) == 2 and book.stats.polls == 7 and book.stats.runs_read == 8

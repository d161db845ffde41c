"""The set-based pass of ``complete_tasks`` (``pgflow._complete_started_tasks`` over the whole batch).

A batch whose elements name different tasks and each run one step (several tasks of one map step
may share a run), all started with started queue tasks, no possible
[TYPE_VIOLATION] and no realtime.send, is applied with one statement per table; every other batch,
or one whose set-based pass raises, goes element by element. Either way the outcome must be what
one ``complete_task`` per element, in array order, gives. These tests drive two identical flows
the same way, one with single calls and one with batches, and compare every row
(tests/runtime/test_batch_reports.py's ``_state``), the rows each call returned and the order in
which the next steps' messages were sent; they also check which path each batch took (the
server's per-transaction function call counts), so a case meant for the set-based pass cannot
silently go element by element, and the other way round.

Cases the set-based pass could get wrong: a batch where only some elements are independent, two
steps of one run, several tasks of one map step (counted down once, completed at the last, with
outputs in task_index order), the last task of a run, a run failed by another session while the
batch waited for it, the same task twice, a late task among live ones of its step, an error raised
in the pass (named by its element, as the element path names it), and several callers on real
connections reporting overlapping batches (of different runs, and of one run's map step), with and
without concurrent claims.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from tests.runtime.driver import commit_when_blocked, concurrently, raises_sqlstate
from tests.runtime.test_batch_reports import _element, _state

pytestmark = pytest.mark.upgraded_only(reason="complete_tasks' set-based pass exists from the queue stage (0003) on")

DEADLINE = 60.0
SET_BASED = "pgflow._complete_started_tasks(uuid[], text[], integer[], jsonb[], text)"
"""Called once for the whole batch, then once per element when the batch goes element by element."""
ONE_RUN_START = "pgflow.start_ready_steps(uuid)"
CALLS = "SELECT coalesce(pg_stat_get_xact_function_calls(%s::regprocedure), 0) AS n"


def _batch(conn: psycopg.Connection, tasks: list[tuple[dict, Any]], starts: list[int] | None = None,
           ) -> tuple[list[dict], str]:
    """One ``complete_tasks`` call in its own transaction: (returned rows, path taken). The path is
    ``set`` when the core was called once, for the whole batch, else ``elements``. ``starts``, when
    given, receives how many runs started their ready steps one by one (``start_ready_steps(uuid)``
    calls; 0 when the pass started them together; a single run that moves on goes through
    ``_advance_run``, as one ``complete_task`` moves it)."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SET LOCAL track_functions = 'all'")
        before = cur.execute(CALLS, (SET_BASED,)).fetchone()["n"]
        one_by_one = cur.execute(CALLS, (ONE_RUN_START,)).fetchone()["n"]
        rows = cur.execute("SELECT * FROM pgflow.complete_tasks(%s)", (Jsonb([_element(t, v) for t, v in tasks]),)).fetchall()
        calls = cur.execute(CALLS, (SET_BASED,)).fetchone()["n"] - before
        if starts is not None:
            starts.append(cur.execute(CALLS, (ONE_RUN_START,)).fetchone()["n"] - one_by_one)
        assert calls >= 1  # the pass is always asked first
    return rows, ("set" if calls == 1 else "elements")


class Twin:
    """One flow driven by single calls and its twin by batches, step for step."""

    def __init__(self, rt, shape: list[dict], runs: int, **options: Any) -> None:
        self.rt = rt
        self.slugs = {False: f"single_{uuid.uuid4().hex[:6]}", True: f"batched_{uuid.uuid4().hex[:6]}"}
        self.runs: dict[bool, list[uuid.UUID]] = {}
        self.pool: dict[bool, list[dict]] = {False: [], True: []}
        self.paths: list[str] = []
        self.returned: dict[bool, list[list[tuple]]] = {False: [], True: []}
        for batch, slug in self.slugs.items():
            rt.flow(slug, shape, **options)
            self.runs[batch] = [rt.start(slug, {"n": i}) for i in range(runs)]

    def poll(self) -> None:
        for batch, slug in self.slugs.items():
            self.pool[batch].extend(self.rt.poll(slug))

    def pick(self, batch: bool, run: int, step: str, index: int = 0) -> dict:
        """A claimed task of this side (stays in the pool: the same task may be reported twice)."""
        run_id = self.runs[batch][run]
        return next(t for t in self.pool[batch]
                    if t["run_id"] == run_id and t["step_slug"] == step and t["task_index"] == index)

    def complete(self, picks: list[tuple[int, str, int, Any]], path: str | None = None,
                 one_by_one: int | None = None) -> None:
        """Report ``(run, step, task_index, output)`` picks on both sides; the batch must take ``path``
        and start ``one_by_one`` runs' ready steps one run at a time (0: all together)."""
        for batch in (False, True):
            tasks = [(self.pick(batch, r, s, i), v) for r, s, i, v in picks]
            if batch:
                starts: list[int] = []
                rows, taken = _batch(self.rt.conn, tasks, starts)
                self.paths.append(taken)
                if path is not None:
                    assert taken == path, (picks, taken)
                if one_by_one is not None:
                    assert starts == [one_by_one], (picks, starts)
            else:
                rows = [row for t, v in tasks
                        if (row := self.rt.complete(t["run_id"], t["step_slug"], t["task_index"], v))]
            order = {r: i for i, r in enumerate(self.runs[batch])}
            self.returned[batch].append([(order[r["run_id"]], r["step_slug"], r["task_index"], r["status"],
                                          r["attempts_count"], r["output"]) for r in rows])

    def sent_order(self, batch: bool) -> list[tuple]:
        """The tasks with a message, in message_id order (the order their messages were sent)."""
        order = {r: i for i, r in enumerate(self.runs[batch])}
        rows = self.rt.rows("SELECT run_id, step_slug, task_index FROM pgflow.step_tasks "
                            "WHERE flow_slug = %s AND message_id IS NOT NULL ORDER BY message_id", (self.slugs[batch],))
        return [(order[r["run_id"]], r["step_slug"], r["task_index"]) for r in rows]

    def assert_same(self) -> None:
        assert self.returned[True] == self.returned[False]
        assert _state(self.rt, self.slugs[True]) == _state(self.rt, self.slugs[False])
        assert self.sent_order(True) == self.sent_order(False)


LINEAR = [{"slug": "a"}, {"slug": "b", "deps": ["a"]}, {"slug": "c", "deps": ["b"]}]


def test_independent_elements_take_the_set_based_pass_and_end_like_single_calls(rt):
    twin = Twin(rt, LINEAR, runs=4)
    twin.poll()
    # the next steps of the four runs start together (one send for the batch)
    twin.complete([(r, "a", 0, {"a": r}) for r in range(4)], path="set", one_by_one=0)
    twin.poll()
    # reversed run order: the next steps' messages go out in array order, as one call per element sends them
    twin.complete([(r, "b", 0, {"b": r}) for r in (3, 1, 0, 2)], path="set", one_by_one=0)
    twin.poll()
    # every run's last task: the runs complete in the pass
    twin.complete([(r, "c", 0, {"c": r}) for r in (2, 0, 3, 1)], path="set", one_by_one=0)
    twin.assert_same()
    assert [rt.run(r)["status"] for r in twin.runs[True]] == ["completed"] * 4
    assert rt.run(twin.runs[True][1])["output"] == {"c": {"c": 1}}


def test_next_steps_with_different_start_delays_start_run_by_run(rt):
    """One message per send: steps with two start delays cannot share one pgmq.send_batch."""
    shape = [{"slug": "a"}, {"slug": "b", "deps": ["a"]}, {"slug": "c", "deps": ["b"], "start_delay": 30}]
    twin = Twin(rt, shape, runs=3)
    twin.poll()
    twin.complete([(0, "a", 0, "a0"), (1, "a", 0, "a1")], path="set", one_by_one=0)
    twin.poll()
    # run 0 starts c (30 s delay), run 2 starts b (none): run by run, in array order
    twin.complete([(0, "b", 0, "b0"), (2, "a", 0, "a2")], path="set", one_by_one=2)
    twin.complete([(1, "b", 0, "b1")], path="set", one_by_one=1)  # one run moves on as complete_task moves it
    twin.assert_same()
    assert [t["status"] for t in rt.tasks(twin.runs[True][0], "c")] == ["queued"]


def test_a_mixed_batch_goes_element_by_element_and_the_independent_ones_after_it_take_the_pass(rt):
    shape = [{"slug": "a"}, {"slug": "side"}, {"slug": "b", "deps": ["a", "side"]}]
    twin = Twin(rt, shape, runs=3)
    twin.poll()
    # run 1 twice (its two roots): the whole batch goes element by element
    twin.complete([(0, "a", 0, "a0"), (1, "a", 0, "a1"), (1, "side", 0, "s1")], path="elements")
    twin.complete([(0, "side", 0, "s0"), (2, "a", 0, "a2")], path="set")  # run 0's b starts, run 2 waits
    twin.poll()
    twin.complete([(2, "side", 0, "s2"), (1, "b", 0, "b1")], path="set")
    twin.poll()
    twin.complete([(0, "b", 0, "b0"), (2, "b", 0, "b2")], path="set")
    twin.assert_same()
    assert [rt.run(r)["status"] for r in twin.runs[True]] == ["completed"] * 3


def test_map_tasks_of_different_runs_take_the_pass_and_the_last_one_orders_the_output(rt):
    shape = [{"slug": "a"}, {"slug": "m", "deps": ["a"], "step_type": "map"}, {"slug": "z", "deps": ["m"]}]
    twin = Twin(rt, shape, runs=2)
    twin.poll()
    # the map children learn their sizes from the arrays (3 and 2 tasks)
    twin.complete([(0, "a", 0, [1, 2, 3]), (1, "a", 0, [4, 5])], path="set")
    twin.poll()
    twin.complete([(0, "m", 2, "m0.2"), (1, "m", 1, "m1.1")], path="set")   # neither is a step's last task
    twin.complete([(0, "m", 1, "m0.1"), (0, "m", 0, "m0.0")], path="set")  # two tasks of one run's map step
    twin.complete([(1, "m", 0, "m1.0")], path="set")  # the last task: output in task_index order
    twin.poll()
    twin.complete([(1, "z", 0, "z1"), (0, "z", 0, "z0")], path="set")
    twin.assert_same()
    assert rt.steps(twin.runs[True][1])["m"]["output"] == ["m1.0", "m1.1"]
    assert rt.steps(twin.runs[True][0])["m"]["output"] == ["m0.0", "m0.1", "m0.2"]


MAP = [{"slug": "a"}, {"slug": "m", "deps": ["a"], "step_type": "map"}, {"slug": "z", "deps": ["m"]}]


def test_several_tasks_of_one_map_step_count_it_down_once_and_complete_it_at_the_last(rt):
    twin = Twin(rt, MAP, runs=3)
    twin.poll()
    twin.complete([(0, "a", 0, list(range(6))), (1, "a", 0, [10, 11, 12]), (2, "a", 0, [20, 21])], path="set")
    twin.poll()
    # two runs' map tasks interleaved, none the last: each step state written once, counted down by its share
    batch_run0 = twin.runs[True][0]
    twin.complete([(0, "m", 4, "m0.4"), (1, "m", 2, "m1.2"), (0, "m", 1, "m0.1"), (0, "m", 5, "m0.5"),
                   (1, "m", 0, "m1.0")], path="set")
    assert rt.steps(batch_run0)["m"]["remaining_tasks"] == 3
    assert rt.steps(twin.runs[True][1])["m"]["remaining_tasks"] == 1
    # run 1's last task sits between run 0's last three: run 1 moves on first (its element comes
    # first), run 0 at its last element; outputs in task_index order whatever the array order
    twin.complete([(0, "m", 3, "m0.3"), (1, "m", 1, "m1.1"), (0, "m", 0, "m0.0"), (2, "m", 1, "m2.1"),
                   (0, "m", 2, "m0.2")], path="set")
    twin.poll()
    twin.complete([(2, "m", 0, "m2.0"), (0, "z", 0, "z0"), (1, "z", 0, "z1")], path="set")
    twin.poll()
    twin.complete([(2, "z", 0, "z2")], path="set")
    twin.assert_same()
    assert rt.steps(batch_run0)["m"]["output"] == [f"m0.{i}" for i in range(6)]
    assert rt.steps(twin.runs[True][1])["m"]["output"] == ["m1.0", "m1.1", "m1.2"]
    assert [rt.run(r)["status"] for r in twin.runs[True]] == ["completed"] * 3


def test_a_map_task_twice_or_a_late_one_among_live_ones_goes_element_by_element(rt):
    twin = Twin(rt, MAP, runs=2)
    twin.poll()
    twin.complete([(0, "a", 0, [1, 2, 3, 4]), (1, "a", 0, [5, 6])], path="set")
    twin.poll()
    # the same map task twice: the second is a late report, as two single calls
    twin.complete([(0, "m", 0, "first"), (0, "m", 1, "m0.1"), (0, "m", 0, "second")], path="elements")
    # a late element (completed above) among live ones of the same step
    twin.complete([(0, "m", 2, "m0.2"), (0, "m", 1, "again"), (1, "m", 0, "m1.0")], path="elements")
    # a map step's tasks and another step of the same run: the map completing starts z between them
    twin.complete([(1, "m", 1, "m1.1"), (0, "m", 3, "m0.3")], path="set")
    twin.poll()
    twin.complete([(0, "z", 0, "z0"), (1, "z", 0, "z1")], path="set")
    twin.assert_same()
    assert rt.steps(twin.runs[True][0])["m"]["output"] == ["first", "m0.1", "m0.2", "m0.3"]


def test_two_steps_of_one_run_go_element_by_element(rt):
    shape = [{"slug": "a"}, {"slug": "m", "deps": ["a"], "step_type": "map"}, {"slug": "side"},
             {"slug": "z", "deps": ["m", "side"]}]
    twin = Twin(rt, shape, runs=1)
    twin.poll()
    twin.complete([(0, "a", 0, [1, 2])], path="set")
    twin.poll()
    # the map's tasks and the run's other root step in one batch
    twin.complete([(0, "m", 0, "m0"), (0, "side", 0, "s"), (0, "m", 1, "m1")], path="elements")
    twin.poll()
    twin.complete([(0, "z", 0, "z")], path="set")
    twin.assert_same()


def test_an_empty_array_for_a_map_child_and_a_type_violation(rt):
    shape = [{"slug": "a"}, {"slug": "m", "deps": ["a"], "step_type": "map"}, {"slug": "z", "deps": ["m"]}]
    twin = Twin(rt, shape, runs=5)
    twin.poll()
    # an empty map completes at once (taskless cascade) inside the pass
    twin.complete([(0, "a", 0, []), (1, "a", 0, [7])], path="set")
    # a single step feeding a map with a non-array fails its run: never in a pass of several elements
    twin.complete([(2, "a", 0, {"not": "an array"}), (3, "a", 0, [8])], path="elements")
    # one element is the single call's own path: the core fails the run itself
    twin.complete([(4, "a", 0, "not an array either")], path="set")
    twin.poll()
    twin.complete([(1, "m", 0, 70), (0, "z", 0, "z0"), (3, "m", 0, 80)], path="set")
    twin.poll()
    twin.complete([(1, "z", 0, "z1"), (3, "z", 0, "z3")], path="set")
    twin.assert_same()
    assert [rt.run(r)["status"] for r in twin.runs[True]] == ["completed", "completed", "failed", "completed", "failed"]
    assert rt.task(twin.runs[True][4], "a")["output"] == "not an array either"


def test_the_same_task_twice_and_late_reports_go_element_by_element(rt):
    twin = Twin(rt, LINEAR, runs=2)
    twin.poll()
    twin.complete([(0, "a", 0, "first"), (1, "a", 0, "a1"), (0, "a", 0, "second")], path="elements")
    twin.complete([(0, "a", 0, "again"), (1, "a", 0, "again")], path="elements")  # both late: completed already
    twin.poll()
    twin.complete([(0, "b", 0, "b0"), (1, "b", 0, "b1")], path="set")
    twin.assert_same()
    assert rt.task(twin.runs[True][0], "a")["output"] == "first"


def test_a_run_failed_by_another_session_while_the_batch_waited(rt, db):
    """The batch waits for the run lock of a session failing that run; after its commit the batch
    sees the run failed: that element is late, the others complete (element by element)."""
    twin = Twin(rt, LINEAR, runs=3, max_attempts=1)
    twin.poll()
    failer, reporter = db.connect(autocommit=False), db.connect()
    try:
        # single side: the failure first, then one complete_task per element
        single = twin.pick(False, 1, "a")
        rt.fail(single["run_id"], "a", 0, "gone")
        # batch side: the failure holds run 1's lock while the batch asks for it
        doomed = twin.pick(True, 1, "a")
        failer.execute("SELECT * FROM pgflow.fail_task(%s, 'a', 0, 'gone')", (doomed["run_id"],))
        tasks = [(twin.pick(True, r, "a"), f"a{r}") for r in range(3)]
        outcome = commit_when_blocked(rt.conn, failer, reporter, lambda: _batch(reporter, tasks))
        assert "error" not in outcome, outcome
        rows, path = outcome["value"]
        assert path == "elements"
        assert [r["status"] for r in rows] == ["completed", "failed", "completed"]
        twin.paths.append(path)
        order = {r: i for i, r in enumerate(twin.runs[True])}
        twin.returned[True].append([(order[r["run_id"]], r["step_slug"], r["task_index"], r["status"],
                                     r["attempts_count"], r["output"]) for r in rows])
        singles = [row for r in range(3) if (row := rt.complete(twin.runs[False][r], "a", 0, f"a{r}"))]
        order = {r: i for i, r in enumerate(twin.runs[False])}
        twin.returned[False].append([(order[r["run_id"]], r["step_slug"], r["task_index"], r["status"],
                                      r["attempts_count"], r["output"]) for r in singles])
    finally:
        failer.close()
        reporter.close()
    twin.assert_same()
    assert [rt.run(r)["status"] for r in twin.runs[True]] == ["started", "failed", "started"]


def test_an_error_in_the_pass_is_raised_by_its_element_as_the_element_path_raises_it(rt):
    """The next step's queue is gone for one run's flow: starting it fails. The pass is undone and
    the element path raises the single call's error, naming element 1; nothing is applied."""
    rt.require_live_messages = False  # the dropped queue held live messages
    rt.flow("fine", LINEAR)
    rt.flow("broken", LINEAR)
    ok, bad = rt.start("fine", {"n": 0}), rt.start("broken", {"n": 0})
    fine, broken = rt.poll("fine")[0], rt.poll("broken")[0]
    rt.conn.execute("SELECT pgmq.drop_queue(%s)", (rt.queue("broken"),))
    with raises_sqlstate("42P01") as single:  # relation does not exist
        rt.complete(bad, "a", 0, "x")
    message = str(single.error).splitlines()[0]
    with raises_sqlstate("42P01") as batched:
        rt.rows("SELECT * FROM pgflow.complete_tasks(%s)", (Jsonb([_element(fine, "x"), _element(broken, "x")]),))
    assert str(batched.error).splitlines()[0] == f"complete_tasks(): element 1: {message}; nothing was applied"
    assert rt.task(ok, "a")["status"] == "started" and rt.task(bad, "a")["status"] == "started"
    # the broken flow's rows are left as the failed call found them; remove them for the invariants
    rt.conn.execute("DELETE FROM pgflow.step_tasks WHERE run_id = %s", (bad,))
    rt.conn.execute("DELETE FROM pgflow.step_states WHERE run_id = %s", (bad,))
    rt.conn.execute("DELETE FROM pgflow.runs WHERE run_id = %s", (bad,))


# --- several callers on real connections ---------------------------------------------------------

def test_overlapping_independent_batches_from_several_connections_finish_each_task_once(rt, db):
    rt.flow("wide", LINEAR)
    paths: list[str] = []
    for round_no in range(4):
        runs = [rt.start("wide", {"n": i, "round": round_no}) for i in range(12)]
        for step, nxt in (("a", "b"), ("b", "c"), ("c", None)):
            tasks = [t for t in rt.poll("wide") if t["step_slug"] == step]
            assert len(tasks) == 12
            picks = [(t, {step: round_no}) for t in tasks]
            # overlapping sets in different orders; one task per run in each
            payloads = [picks[:8], list(reversed(picks[4:])), picks[2:10][::-1]]
            results = concurrently(db, [lambda c, p=p: _batch(c, p) for p in payloads])
            paths += [path for _, path in results]
            for rows, _ in results:
                assert all(r["status"] == "completed" for r in rows)
            for run in runs:
                state = rt.steps(run)[step]
                assert (state["status"], state["remaining_tasks"]) == ("completed", 0)
                assert rt.task(run, step)["output"] == {step: round_no}
                if nxt:
                    after = rt.tasks(run, nxt)
                    assert len(after) == 1 and after[0]["status"] == "queued"  # started exactly once
        assert all(rt.run(run)["status"] == "completed" for run in runs)
        assert rt.messages("wide") == []
    assert "set" in paths  # at least the first caller of each batch took the pass


@pytest.mark.parametrize("via", ["direct", "pgbouncer"])
def test_concurrent_claims_then_set_based_reports_run_each_task_exactly_once(rt, db, via, request):
    """``pgbouncer``: the three callers go through a real PgBouncer in transaction mode (strict)."""
    callers = db if via == "direct" else db.through(request.getfixturevalue("pgbouncer"))
    rt.flow("claimed", LINEAR)
    workers = [uuid.uuid4() for _ in range(3)]
    for worker in workers:
        rt.conn.execute("SELECT pgflow.register_worker(%s, 'test-worker', 'claimed', 'claimed')", (worker,))
    for _ in range(3):
        runs = [rt.start("claimed", {"n": i}) for i in range(9)]
        for _step in ("a", "b", "c"):
            batch = [m["msg_id"] for m in rt.read("claimed")]
            assert len(batch) == 9

            def claim_and_report(conn: psycopg.Connection, worker, batch=batch) -> tuple[int, str]:
                with conn.cursor(row_factory=dict_row) as cur:
                    rows = cur.execute("SELECT run_id, step_slug, task_index FROM pgflow.claim_tasks("
                                       "'claimed', %s::bigint[], %s, 'claimed') WHERE outcome = 'claimed'",
                                       (batch, worker)).fetchall()
                if not rows:
                    return 0, "none"
                _, path = _batch(conn, [(r, "done") for r in rows])
                return len(rows), path

            outcomes = concurrently(callers, [lambda c, w=w: claim_and_report(c, w) for w in workers])
            assert sum(n for n, _ in outcomes) == 9
            assert all(path in ("set", "none") for _, path in outcomes), outcomes
        for run in runs:
            assert rt.run(run)["status"] == "completed"
            assert all(t["attempts_count"] == 1 and t["status"] == "completed" for t in rt.tasks(run))
    assert rt.messages("claimed") == []


def test_overlapping_batches_of_one_map_step_from_several_connections_finish_it_once(rt, db):
    """Three callers report overlapping batches of one run's map tasks in different orders: each
    takes the run's and the step state's locks in the same order, so none deadlocks; the later ones
    see the earlier ones' tasks completed (late elements, element by element). Every task ends
    once, the step completes once with its outputs in task_index order, and z starts once."""
    rt.flow("wide_map", MAP)
    paths: list[str] = []
    for round_no in range(3):
        run = rt.start("wide_map", {"round": round_no})
        rt.poll("wide_map")
        rt.complete(run, "a", 0, list(range(12)))
        tasks = sorted(rt.poll("wide_map"), key=lambda t: t["task_index"])
        assert [t["task_index"] for t in tasks] == list(range(12))
        picks = [(t, {"i": t["task_index"]}) for t in tasks]
        payloads = [picks[:8], list(reversed(picks[4:])), picks[2:10][::-1]]
        results = concurrently(db, [lambda c, p=p: _batch(c, p) for p in payloads])
        paths += [path for _, path in results]
        for rows, _ in results:
            assert all(r["status"] == "completed" and r["attempts_count"] == 1 for r in rows)
        state = rt.steps(run)["m"]
        assert (state["status"], state["remaining_tasks"]) == ("completed", 0)
        assert state["output"] == [{"i": i} for i in range(12)]
        after = rt.tasks(run, "z")
        assert len(after) == 1 and after[0]["status"] == "queued"  # started exactly once
        rt.poll("wide_map")
        rt.complete(run, "z", 0, "z")
        assert rt.run(run)["status"] == "completed"
    assert rt.messages("wide_map") == []
    assert "set" in paths  # the first caller of each round took the pass

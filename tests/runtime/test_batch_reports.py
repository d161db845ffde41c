"""Batch reports (the queue stage, 0003): ``pgflow.complete_tasks`` / ``pgflow.fail_tasks`` do what one
``complete_task`` / ``fail_task`` per element does, in one call (docs/runtime.md "Batch reports").

* the same end state as the single calls, compared row by row (runs, step states, tasks, queue and
  archive rows) between two identical flows driven the same way, one per path;
* a malformed element raises naming its index and applies nothing (an element the single call
  refuses: tests/manual/test_batch_reports.py);
* several callers on real connections, each reporting overlapping batches in different orders,
  never deadlock and finish every task exactly once; the same after concurrent claims, also with
  the callers behind a real PgBouncer in transaction mode.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.runtime.driver import concurrently

pytestmark = pytest.mark.upgraded_only(reason="complete_tasks / fail_tasks exist from the queue stage (0003) on")

DEADLINE = 60.0
SHAPE = [
    {"slug": "a"},
    {"slug": "m", "deps": ["a"], "step_type": "map"},
    {"slug": "z", "deps": ["m"]},
    {"slug": "side", "max_attempts": 2, "base_delay": 0, "when_exhausted": "skip"},
]


def _element(task: dict, value: Any, key: str = "output") -> dict:
    return {"run_id": str(task["run_id"]), "step_slug": task["step_slug"], "task_index": task["task_index"], key: value}


def _complete(rt, tasks: list[tuple[dict, Any]], batch: bool) -> list[dict]:
    if batch:
        return rt.rows("SELECT * FROM pgflow.complete_tasks(%s)", (Jsonb([_element(t, v) for t, v in tasks]),))
    return [row for t, v in tasks if (row := rt.complete(t["run_id"], t["step_slug"], t["task_index"], v))]


def _fail(rt, tasks: list[tuple[dict, str]], batch: bool) -> list[dict]:
    if batch:
        return rt.rows("SELECT * FROM pgflow.fail_tasks(%s)", (Jsonb([_element(t, v, "error_message") for t, v in tasks]),))
    return [row for t, v in tasks if (row := rt.fail(t["run_id"], t["step_slug"], t["task_index"], v))]


def _drive(rt, slug: str, batch: bool) -> list[list[tuple]]:
    """Three runs through every kind of report; returns what each report call returned."""
    runs = [rt.start(slug, {"n": i}) for i in range(3)]
    pool: list[dict] = []  # claimed and not reported yet
    returned = []

    def take(step: str) -> list[dict]:
        mine = sorted((t for t in pool if t["step_slug"] == step), key=lambda t: (runs.index(t["run_id"]), t["task_index"]))
        pool[:] = [t for t in pool if t["step_slug"] != step]
        return mine

    pool.extend(rt.poll(slug))
    first, side = take("a"), take("side")
    # run 0 maps over 3 items, run 1 over none (an empty map completes at once), run 2 feeds a map
    # a non-array (type violation: the run fails); the same task twice in one call: the second
    # report is late
    returned.append(_complete(rt, [(first[0], [1, 2, 3]), (first[1], []), (first[2], {"not": "an array"}),
                                   (first[0], [9])], batch))
    # side (2 attempts, base delay 0): runs 0 and 1 fail once and are retried at once
    returned.append(_fail(rt, [(side[0], "first"), (side[1], "once")], batch))
    pool.extend(rt.poll(slug))
    again = take("side")
    # run 0 exhausts (when_exhausted skip); run 1 completes; run 2's side task was cancelled (late)
    returned.append(_fail(rt, [(again[0], "second")], batch))
    returned.append(_complete(rt, [(again[1], "side done"), (side[2], "side 2")], batch))
    # the map tasks of run 0 in reverse index order, and a report for a run that does not exist
    ghost = {"run_id": "00000000-0000-0000-0000-000000000000", "step_slug": "m", "task_index": 0}
    returned.append(_complete(rt, [(t, t["input"] * 10) for t in reversed(take("m"))] + [(ghost, 1)], batch))
    pool.extend(rt.poll(slug))
    returned.append(_complete(rt, [(t, {"sum": sum(t["input"]["m"])}) for t in take("z")], batch))
    assert pool == []
    assert [rt.run(r)["status"] for r in runs] == ["completed", "completed", "failed"]
    return [[(r["step_slug"], r["task_index"], r["status"], r["attempts_count"]) for r in call] for call in returned]


def _state(rt, slug: str) -> dict:
    """Every row of the flow, without ids, times and names that differ between the two flows."""
    runs = rt.rows("SELECT run_id, status, remaining_steps, output, input FROM pgflow.runs WHERE flow_slug = %s "
                   "ORDER BY input ->> 'n'", (slug,))
    order = {r["run_id"]: i for i, r in enumerate(runs)}
    states = rt.rows("SELECT run_id, step_slug, status, remaining_deps, remaining_tasks, initial_tasks, output, "
                     "skip_reason, error_message, started_at IS NOT NULL AS started, completed_at IS NOT NULL AS completed "
                     "FROM pgflow.step_states WHERE flow_slug = %s", (slug,))
    tasks = rt.rows("SELECT run_id, step_slug, task_index, status, attempts_count, output, error_message, "
                    "message_id IS NOT NULL AS has_message FROM pgflow.step_tasks WHERE flow_slug = %s", (slug,))
    queue = rt.queue(slug)
    live = rt.rows(f"SELECT message, read_ct FROM {rt.qtable(queue).as_string(rt.conn)}")
    archived = rt.rows(f"SELECT message FROM {rt.qtable(queue, 'a').as_string(rt.conn)}")

    def key(row: dict) -> tuple:
        return (order[row["run_id"]], row.get("step_slug"), row.get("task_index"))

    def plain(row: dict) -> dict:
        return {k: v for k, v in row.items() if k != "run_id"} | {"run": order[row["run_id"]]}

    def body(message: dict) -> tuple:
        return (order[uuid.UUID(message["run_id"])], message["step_slug"], message["task_index"])

    return {
        "runs": [{k: v for k, v in r.items() if k != "run_id"} for r in runs],
        "states": [plain(s) for s in sorted(states, key=key)],
        "tasks": [plain(t) for t in sorted(tasks, key=key)],
        "live": sorted((body(m["message"]), m["read_ct"]) for m in live),
        "archived": sorted(body(m["message"]) for m in archived),
    }


def test_batches_reach_the_same_state_as_single_calls(rt):
    for slug in ("single", "batched"):
        rt.flow(slug, SHAPE)
    single = _drive(rt, "single", batch=False)
    batched = _drive(rt, "batched", batch=True)
    assert batched == single
    assert _state(rt, "batched") == _state(rt, "single")
    # the scenario reached every outcome it is meant to compare
    statuses = {(t["step_slug"], t["status"]) for t in _state(rt, "batched")["tasks"]}
    assert {("a", "completed"), ("a", "failed"), ("m", "completed"), ("side", "failed"), ("side", "completed"),
            ("z", "completed")} <= statuses


def _archive_calls(rt, report) -> int:
    """pgmq.archive calls made by ``report()`` (the session's not yet reported function counts, before
    and after; track_functions on for this transaction)."""
    count = "SELECT coalesce(pg_stat_get_xact_function_calls('pgmq.archive(text, bigint[])'::regprocedure), 0) AS n"
    with rt.conn.transaction():
        rt.conn.execute("SET LOCAL track_functions = 'all'")
        before = rt.val(count)
        report()
        return rt.val(count) - before


def test_a_batch_archives_once_per_queue(rt):
    rt.flow("arch", [{"slug": "each", "step_type": "map"}])
    runs = [rt.start("arch", list(range(3))) for _ in range(2)]
    tasks = rt.poll("arch")
    single, batched = tasks[:3], tasks[3:]
    assert _archive_calls(rt, lambda: _complete(rt, [(t, t["input"]) for t in single], batch=False)) == 3
    returned: list[dict] = []
    assert _archive_calls(rt, lambda: returned.extend(_complete(rt, [(t, t["input"]) for t in batched], batch=True))) == 1
    assert [(r["run_id"], r["task_index"]) for r in returned] == [(t["run_id"], t["task_index"]) for t in batched]
    assert [rt.run(r)["status"] for r in runs] == ["completed", "completed"]
    assert len(rt.archived("arch")) == 6 and rt.messages("arch") == []


@pytest.mark.parametrize("bad, problem", [
    ({"step_slug": "a", "task_index": 0, "output": 1}, "lacks a key"),
    ({"run_id": "not-a-uuid", "step_slug": "a", "task_index": 0, "output": 1}, "run_id is not a UUID"),
    ({"run_id": "00000000-0000-0000-0000-000000000000", "step_slug": "a", "task_index": 1.5, "output": 1},
     "task_index is not an integer"),
    ({"run_id": "00000000-0000-0000-0000-000000000000", "step_slug": 7, "task_index": 0, "output": 1},
     "step_slug is not a string"),
    ([1, 2], "is not a JSON object"),
])
def test_a_malformed_element_raises_with_its_index_and_applies_nothing(rt, bad, problem):
    rt.flow("bad", [{"slug": "each", "step_type": "map"}])
    run = rt.start("bad", [1, 2, 3])
    tasks = rt.poll("bad")
    payload = [_element(tasks[0], 1), _element(tasks[1], 2), bad]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=rf"complete_tasks\(\): element 2: {problem}"):
        rt.conn.execute("SELECT * FROM pgflow.complete_tasks(%s)", (Jsonb(payload),))
    assert [t["status"] for t in rt.tasks(run)] == ["started"] * 3
    assert len(rt.messages("bad")) == 3 and rt.archived("bad") == []


def test_not_an_array_is_refused(rt):
    for function in ("complete_tasks", "fail_tasks"):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=rf"{function}\(\): tasks must be a JSON array"):
            rt.conn.execute(f"SELECT * FROM pgflow.{function}(%s)", (Jsonb({"run_id": "x"}),))
    assert rt.rows("SELECT * FROM pgflow.complete_tasks('[]')") == []


def _report_concurrently(db, payloads: list[list[dict]], function: str = "complete_tasks") -> list[list[dict]]:
    """Each payload from its own connection, all released at once; returns each call's rows
    (a deadlock would raise: tests/runtime/driver.py ``concurrently``)."""
    def call(conn: psycopg.Connection, payload: list[dict]) -> list[dict]:
        with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
            return cur.execute(f"SELECT * FROM pgflow.{function}(%s)", (Jsonb(payload),)).fetchall()

    return concurrently(db, [lambda c, p=p: call(c, p) for p in payloads], deadline=DEADLINE)


def test_concurrent_batches_over_many_runs_never_deadlock_and_finish_each_task_once(rt, db):
    rt.flow("busy", [{"slug": "each", "step_type": "map"}, {"slug": "after", "deps": ["each"]}])
    for round_no in range(8):
        runs = [rt.start("busy", list(range(4))) for _ in range(6)]
        tasks = [t for t in rt.poll("busy") if t["step_slug"] == "each"]
        assert len(tasks) == 24
        elements = [_element(t, t["input"]) for t in tasks]
        # three callers, overlapping sets in different orders: the runs they lock overlap
        payloads = [elements, list(reversed(elements)), elements[5:] + elements[:5]]
        results = _report_concurrently(db, payloads)
        completed_by = [sum(1 for r in rows if r["status"] == "completed") for rows in results]
        assert all(n == 24 for n in completed_by), completed_by  # later callers see completed rows (late reports)
        for run in runs:
            assert rt.run(run)["status"] == "started"
            assert rt.steps(run)["each"]["status"] == "completed"
            assert rt.steps(run)["each"]["output"] == [0, 1, 2, 3]
            after = rt.tasks(run, "after")
            assert len(after) == 1 and after[0]["status"] == "queued"  # the child started exactly once
        finals = [t for t in rt.poll("busy") if t["step_slug"] == "after"]
        assert len(finals) == 6
        _complete(rt, [(t, round_no) for t in finals], batch=True)
        assert all(rt.run(run)["status"] == "completed" for run in runs)
        assert rt.messages("busy") == []


def test_concurrent_fail_batches_use_each_attempt_once(rt, db):
    rt.flow("flaky", [{"slug": "each", "step_type": "map", "max_attempts": 3, "base_delay": 0}])
    run = rt.start("flaky", list(range(10)))
    tasks = rt.poll("flaky")
    elements = [_element(t, "boom", "error_message") for t in tasks]
    results = _report_concurrently(db, [elements, list(reversed(elements))], function="fail_tasks")
    assert sorted(r["status"] for rows in results for r in rows) == ["queued"] * 20
    for task in rt.tasks(run):
        assert (task["status"], task["attempts_count"], task["error_message"]) == ("queued", 1, "boom")
    assert len(rt.messages("flaky")) == 10


@pytest.mark.parametrize("via", ["direct", "pgbouncer"])
def test_concurrent_claims_then_batch_reports_run_each_task_exactly_once(rt, db, via, request):
    """``pgbouncer``: the claiming and reporting connections go through a real PgBouncer in transaction
    mode that resets every server connection after each transaction (the claim and the batch report
    need no session state)."""
    rt.flow("race", [{"slug": "each", "step_type": "map"}])
    workers = [uuid.uuid4() for _ in range(3)]
    for worker in workers:
        rt.conn.execute("SELECT pgflow.register_worker(%s, 'test-worker', 'race', 'race')", (worker,))
    callers = db if via == "direct" else db.through(request.getfixturevalue("pgbouncer"))
    conns = [callers.connect() for _ in workers]
    try:
        for _ in range(6):
            run = rt.start("race", list(range(9)))
            batch = [m["msg_id"] for m in rt.read("race")]
            gate = threading.Barrier(len(workers))

            def claim_and_report(conn: psycopg.Connection, worker, gate=gate, batch=batch) -> int:
                gate.wait(timeout=DEADLINE)
                rows = conn.execute("SELECT run_id, step_slug, task_index, input FROM pgflow.claim_tasks("
                                    "'race', %s::bigint[], %s, 'race') WHERE outcome = 'claimed'", (batch, worker)).fetchall()
                payload = [{"run_id": str(r[0]), "step_slug": r[1], "task_index": r[2], "output": r[3]} for r in rows]
                conn.execute("SELECT count(*) FROM pgflow.complete_tasks(%s)", (Jsonb(payload),))
                return len(rows)

            with ThreadPoolExecutor(len(workers)) as pool:
                claimed = [f.result(timeout=DEADLINE) for f in [pool.submit(claim_and_report, c, w)
                                                                for c, w in zip(conns, workers, strict=True)]]
            assert sum(claimed) == 9
            assert rt.run(run)["status"] == "completed"
            assert rt.run(run)["output"] == {"each": list(range(9))}
            assert all(t["attempts_count"] == 1 for t in rt.tasks(run))
    finally:
        for conn in conns:
            conn.close()

"""Hostile batches for the one-statement claim (0015, docs/claim-protocol.md).

Visibility to the second (effective step timeout + 2 s for a claim; a duplicate deferred toward
the recovery deadline, the same one however often it comes back), every outcome in one batch with
map tasks of several runs and maps fed by a dependency, 1000 messages at once, empty and NULL
batches, one session claiming on many routes under ``force_generic_plan`` (plain and step-queued
flows interleaved), and one transaction that claims, fails and claims the same task again (the
claim UPDATE then addresses a row version this transaction wrote). The ``cl`` checks (claim
ledger, message conservation, runtime invariants) run after each test.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pytest
from psycopg.types.json import Jsonb

from pgflow_cli.worker import Flow, with_step_queues
from tests.claim.helpers import ClaimEnv

SECOND = dt.timedelta(seconds=1)


def _vt(cl: ClaimEnv, queue: str, msg_id: int) -> dt.datetime:
    return cl.message(queue, msg_id)["vt"]


def test_claim_visibility_is_the_effective_timeout_plus_2s_and_duplicates_keep_one_deadline(cl):
    cl.flow("vis", [{"slug": "fast", "step_type": "map", "timeout": 11}, {"slug": "slow"}], timeout=7)
    cl.start("vis", [1, 2])
    ids = cl.read("vis")
    first, second = cl.worker("vis"), cl.worker("vis")
    claim = cl.claim("vis", ids, first, "vis")
    assert sorted(r["step_slug"] for r in claim.claimed) == ["fast", "fast", "slow"]
    for row in claim.claimed:
        offset = dt.timedelta(seconds=(11 if row["step_slug"] == "fast" else 7) + 2)
        vt = _vt(cl, "vis", row["message_id"])
        assert claim.before + offset <= vt <= claim.after + offset, (row["step_slug"], vt - claim.before)
    deadlines = {r["message_id"]: cl.task(r["run_id"], r["step_slug"], r["task_index"]) for r in claim.claimed}
    for attempt in range(3):  # an expired read comes back again and again: never a fresh timeout
        cl.make_visible("vis")
        again = cl.claim("vis", ids, second, "vis")
        assert again.outcomes == {m: ("duplicate", "task_started") for m in ids}
        for msg_id, task in deadlines.items():
            timeout = 11 if task["step_slug"] == "fast" else 7
            deadline = task["started_at"] + dt.timedelta(seconds=timeout + 30)
            vt = _vt(cl, "vis", msg_id)
            assert deadline <= vt <= deadline + SECOND + (again.after - again.before), (attempt, vt - deadline)
    for task in cl.tasks():
        assert (task["status"], task["attempts_count"], task["last_worker_id"]) == ("started", 1, first)


def test_every_outcome_in_one_batch_with_maps_of_several_runs_gets_the_right_inputs(cl):
    cl.flow("mix", [{"slug": "root_map", "step_type": "map"}, {"slug": "list", "deps": []},
                    {"slug": "dep_map", "deps": ["list"], "step_type": "map"}, {"slug": "tail", "deps": ["list"]}])
    runs = [cl.start("mix", [f"r{r}e{i}" for i in range(r + 2)]) for r in range(3)]
    worker = cl.worker("mix")
    first = cl.claim("mix", cl.read("mix"), worker, "mix")
    assert len(first.claimed) == 2 + 3 + 4 + 3
    by_task = {(r["run_id"], r["step_slug"], r["task_index"]): r for r in first.claimed}
    for n, run in enumerate(runs):
        for i in range(n + 2):
            assert by_task[(run, "root_map", i)]["input"] == f"r{n}e{i}"
        assert by_task[(run, "list", 0)]["input"] == {}
        assert by_task[(run, "list", 0)]["flow_input"] == [f"r{n}e{i}" for i in range(n + 2)]
        cl.complete(run, "list", 0, [{"run": n, "i": i} for i in range(3 - n)])
    # a late message of a completed task, a foreign message, a duplicate, and the new work of three runs
    late = by_task[(runs[0], "list", 0)]["message_id"]
    cl.restore("mix", [late])
    foreign = cl.send("mix", {"hello": "world"})
    cl.make_visible("mix", [by_task[(runs[1], "root_map", 0)]["message_id"]])
    batch = cl.read("mix")
    second = cl.claim("mix", list(reversed(batch)) + batch[:3] + [None], worker, "mix")
    assert second.outcomes[late] == ("archived_terminal", "task_completed")
    assert second.outcomes[foreign] == ("archived_foreign", "not_pgflow_work")
    assert second.outcomes[by_task[(runs[1], "root_map", 0)]["message_id"]] == ("duplicate", "task_started")
    got = {(r["run_id"], r["step_slug"], r["task_index"]): r for r in second.claimed}
    assert len(got) == 3 + 2 + 1 + 3
    for n, run in enumerate(runs):
        for i in range(3 - n):
            assert got[(run, "dep_map", i)]["input"] == {"run": n, "i": i}
            assert got[(run, "dep_map", i)]["flow_input"] is None
        assert got[(run, "tail", 0)]["input"] == {"list": [{"run": n, "i": i} for i in range(3 - n)]}
    assert late in cl.archived("mix") and foreign in cl.archived("mix")


def test_a_thousand_messages_in_one_claim(cl):
    cl.flow("big", [{"slug": "each", "step_type": "map"}], timeout=5)
    run = cl.start("big", [{"i": i, "s": "\u00e9" * (i % 7)} for i in range(1000)])
    ids = cl.read("big", qty=1000)
    assert len(ids) == 1000
    claim = cl.claim("big", ids + ids[:10], cl.worker("big"), "big")
    assert len(claim.claimed) == 1000
    assert all(r["input"] == {"i": r["task_index"], "s": "\u00e9" * (r["task_index"] % 7)} for r in claim.claimed)
    late = cl.rows("SELECT count(*) AS n FROM pgmq.q_big WHERE vt < %s OR vt > %s",
                   (claim.before + 7 * SECOND, claim.after + 7 * SECOND))
    assert late == [{"n": 0}]
    assert {t["status"] for t in cl.tasks(run)} == {"started"}


@pytest.mark.parametrize("batch", [[], None, [None], [None, None]])
def test_empty_and_null_batches_claim_nothing_and_change_nothing(cl, batch):
    cl.flow("none", [{"slug": "a"}])
    cl.start("none", {})
    worker = cl.worker("none")
    before = cl.snapshot()
    assert cl.claim("none", batch, worker, "none").rows == []
    assert cl.snapshot() == before
    assert cl.worker_row(worker)["deprecated_at"] is None


def _step_mode(cl: ClaimEnv, slug: str) -> dict:
    flow = Flow(slug, max_attempts=2, base_delay=0).step("a", lambda v, c: v).step("b", lambda v, c: v, depends_on=["a"])
    queued = with_step_queues(flow)
    cl.conn.execute("SELECT pgflow.ensure_flow_compiled(%s, %s, protocol_version => 2, queue_mode => 'step', "
                    "route_map => %s)", (slug, Jsonb(flow.shape()), Jsonb(queued.route_map())))
    return {r["step_slug"]: r["queue_name"] for r in cl.rows(
        "SELECT step_slug, queue_name FROM pgflow.steps WHERE flow_slug = %s", (slug,))}


def test_one_session_claims_on_many_routes_under_generic_plans(cl):
    """The same session (so the same cached generic plans) serves plain flows and step queues,
    in turn, many times: every claim returns its own route's tasks with their own inputs."""
    plain = [f"plain_{i}" for i in range(3)]
    for slug in plain:
        cl.flow(slug, [{"slug": "m", "step_type": "map"}, {"slug": "s", "deps": ["m"]}])
    stepped = {slug: _step_mode(cl, slug) for slug in ("stepped_0", "stepped_1")}
    conn = cl.connect()
    workers: dict[tuple, uuid.UUID] = {}

    def claim(flow: str, queue: str, step: str | None) -> list[dict]:
        key = (flow, queue, step)
        if key not in workers:
            workers[key] = cl.worker(flow, queue=queue, step=step, function=f"{flow}-{step}")
        ids = cl.read(queue)
        return cl.claim(queue, ids, workers[key], flow, step, conn=conn).claimed if ids else []

    for round_no in range(12):
        for n, slug in enumerate(plain):
            run = cl.start(slug, [round_no, n, slug])
            got = claim(slug, slug, None)
            assert sorted((r["step_slug"], r["task_index"], json.dumps(r["input"])) for r in got) == [
                ("m", 0, json.dumps(round_no)), ("m", 1, json.dumps(n)), ("m", 2, json.dumps(slug))], round_no
            for r in got:
                cl.complete(run, "m", r["task_index"], r["input"])
            got = claim(slug, slug, None)
            assert [(r["step_slug"], r["input"]) for r in got] == [("s", {"m": [round_no, n, slug]})]
            cl.complete(run, "s", 0, None)
        for slug, queues in stepped.items():
            run = cl.start(slug, {"round": round_no})
            got = claim(slug, queues["a"], "a")
            assert [(r["run_id"], r["step_slug"], r["input"], r["flow_input"]) for r in got] == [
                (run, "a", {}, {"round": round_no})]
            cl.complete(run, "a", 0, {"a": round_no})
            got = claim(slug, queues["b"], "b")
            assert [(r["run_id"], r["input"]) for r in got] == [(run, {"a": {"a": round_no}})]
            cl.complete(run, "b", 0, "done")
    assert {r["status"] for r in cl.rows("SELECT status FROM pgflow.runs")} == {"completed"}


def test_one_transaction_claims_fails_and_claims_the_same_task_again(cl):
    """The second claim's UPDATE addresses the row version this transaction's fail_task wrote."""
    cl.flow("again", [{"slug": "a"}], max_attempts=3, base_delay=0)
    run = cl.start("again", {"x": 1})
    ids = cl.read("again")
    worker = cl.worker("again")
    conn = cl.connect()
    with conn.transaction():
        first = cl.claim("again", ids, worker, "again", conn=conn)
        conn.execute("SELECT pgflow.fail_task(%s, 'a', 0, 'first try')", (run,))
        second = cl.claim("again", ids + ids, worker, "again", conn=conn)
        third = cl.claim("again", ids, worker, "again", conn=conn)
    assert [r["outcome"] for r in first.rows + second.rows + third.rows] == ["claimed", "claimed", "duplicate"]
    task = cl.task(run, "a")
    assert (task["status"], task["attempts_count"], task["error_message"]) == ("started", 2, "first try")
    assert second.claimed[0]["flow_input"] == {"x": 1}


def test_a_batch_in_a_step_queued_flow_starts_the_next_steps_in_their_own_queues(cl):
    """Private step queues (0005): the pass starts the runs' ready steps together only when they
    share a queue (b alone), else run by run (b and c); every message lands in its step's queue
    with the task's identity, and claims from those queues get the right inputs."""
    flow = (Flow("fan", max_attempts=2, base_delay=0).step("a", lambda v, c: v)
            .step("b", lambda v, c: v, depends_on=["a"]).step("c", lambda v, c: v, depends_on=["b"])
            .step("d", lambda v, c: v, depends_on=["b"]))
    cl.conn.execute("SELECT pgflow.ensure_flow_compiled(%s, %s, protocol_version => 2, queue_mode => 'step', "
                    "route_map => %s)", ("fan", Jsonb(flow.shape()), Jsonb(with_step_queues(flow).route_map())))
    queues = {r["step_slug"]: r["queue_name"] for r in cl.rows("SELECT step_slug, queue_name FROM pgflow.steps")}
    assert len(set(queues.values())) == 4
    runs = [cl.start("fan", {"n": n}) for n in range(4)]
    workers = {step: cl.worker("fan", queue=q, step=step, function=f"fan-{step}") for step, q in queues.items()}

    def claim(step: str) -> list[dict]:
        return cl.claim(queues[step], cl.read(queues[step]), workers[step], "fan", step).claimed

    def report(rows: list[dict], output_of) -> None:
        cl.rows("SELECT * FROM pgflow.complete_tasks(%s)", (Jsonb([
            {"run_id": str(r["run_id"]), "step_slug": r["step_slug"], "task_index": r["task_index"],
             "output": output_of(r)} for r in reversed(rows)]),))

    report(claim("a"), lambda r: {"a": runs.index(r["run_id"])})  # b of every run: one queue, together
    got_b = claim("b")
    assert sorted((runs.index(r["run_id"]), r["input"]["a"]["a"]) for r in got_b) == [(n, n) for n in range(4)]
    report(got_b, lambda r: runs.index(r["run_id"]) * 10)  # c and d: two queues, run by run
    for step in ("c", "d"):
        got = claim(step)
        assert sorted((runs.index(r["run_id"]), r["input"]) for r in got) == [(n, {"b": n * 10}) for n in range(4)]
        report(got, lambda r: None)
    assert {r["status"] for r in cl.rows("SELECT status FROM pgflow.runs")} == {"completed"}
    wrong = cl.rows("SELECT t.step_slug, t.queue_name FROM pgflow.step_tasks t JOIN pgflow.steps s "
                    "USING (flow_slug, step_slug) WHERE t.queue_name IS DISTINCT FROM s.queue_name")
    assert wrong == []

"""A batch report that only counts a map down and a claim of the same tasks never deadlock.

Such a batch holds its run ``FOR NO KEY UPDATE`` and a claim holds it ``FOR KEY SHARE``: the two
run side by side, so the run row no longer makes them take turns, and the task rows they share
(a claim's batch names a started task when its message came back while the handler still runs, or
a task stalled recovery queued again while its old worker still reports it) must be locked in the
same order by both: (run_id, step_slug, task_index), the claim's order (docs/runtime.md "Lock
order").

The interleaving is forced with a third connection that holds the claim's first task row: the
claim waits for it with its run locked, the batch then locks what it can, and the holder commits.
"""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.runtime.driver import wait_until_blocked

pytestmark = pytest.mark.upgraded_only(reason="the lock modes of claim_tasks and complete_tasks (0003)")


def _in_thread(call):
    result: dict = {}

    def target():
        try:
            result["value"] = call()
        except psycopg.Error as exc:  # surfaced by the assertions below
            result["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    return thread, result


def _race(rt, db, slug: str, held: tuple[uuid.UUID, int], claim_ids: list[int], report: list[dict]):
    """Hold task ``held`` (run, index of step "each"), start the claim of ``claim_ids`` (it waits
    for that row), start the batch ``report`` (it waits too), then let go. Returns both results."""
    holder = db.connect(autocommit=False)
    holder.execute("SELECT 1 FROM pgflow.step_tasks WHERE run_id = %s AND step_slug = 'each' AND task_index = %s FOR UPDATE",
                   held)
    other = uuid.uuid4()
    rt.conn.execute("SELECT pgflow.register_worker(%s, 'w-second', %s, %s)", (other, rt.queue(slug), slug))
    claimer = db.connect()
    reporter = db.connect()
    claim_thread, claim = _in_thread(lambda: rt.claim_outcomes(slug, claim_ids, other, conn=claimer))
    wait_until_blocked(rt.conn, claimer.info.backend_pid)
    report_thread, reported = _in_thread(
        lambda: reporter.execute("SELECT run_id, task_index, status FROM pgflow.complete_tasks(%s)",
                                 (Jsonb(report),)).fetchall())
    wait_until_blocked(rt.conn, reporter.info.backend_pid)
    holder.commit()
    claim_thread.join(60)
    report_thread.join(60)
    assert not claim_thread.is_alive() and not report_thread.is_alive()
    return claim, reported


def _assert_one_went_first(outcomes: list[dict]) -> None:
    """The claim and the batch took turns on the shared tasks: the claim saw both tasks still
    started (duplicates: it went first) or both finished (archived: the batch went first), never
    one of each."""
    kinds = {r["outcome"] for r in outcomes}
    assert len(outcomes) == 2 and kinds in ({"duplicate"}, {"archived_terminal"}), outcomes


def test_a_batch_naming_a_map_s_tasks_out_of_order_and_a_claim_of_them_do_not_deadlock(rt, db):
    rt.flow("revmap", [{"slug": "each", "step_type": "map"}])
    run = rt.start("revmap", list(range(4)))
    ids = {m["message"]["task_index"]: m["msg_id"] for m in rt.read("revmap")}
    rt.claim("revmap", [ids[i] for i in range(4)])
    rt.make_visible(rt.queue("revmap"))  # tasks 0 and 1 outlive their visibility: their messages come back

    claim, reported = _race(rt, db, "revmap", (run, 0), [ids[0], ids[1]], [
        {"run_id": str(run), "step_slug": "each", "task_index": 1, "output": "one"},
        {"run_id": str(run), "step_slug": "each", "task_index": 0, "output": "zero"},
    ])

    assert "error" not in claim, claim
    assert "error" not in reported, reported
    assert sorted(reported["value"]) == [(run, 0, "completed"), (run, 1, "completed")]
    _assert_one_went_first(claim["value"])
    step = rt.steps(run)["each"]
    assert (step["status"], step["remaining_tasks"]) == ("started", 2)
    assert sorted(m["msg_id"] for m in rt.messages(rt.queue("revmap"))) == [ids[2], ids[3]]


def test_a_set_based_batch_naming_runs_out_of_order_and_a_claim_of_them_do_not_deadlock(rt, db):
    rt.flow("revruns", [{"slug": "each", "step_type": "map"}])
    runs = sorted(rt.start("revruns", list(range(3))) for _ in range(2))
    ids = {(m["message"]["run_id"], m["message"]["task_index"]): m["msg_id"] for m in rt.read("revruns")}
    rt.claim("revruns", list(ids.values()))
    rt.make_visible(rt.queue("revruns"))
    first, second = ids[(str(runs[0]), 0)], ids[(str(runs[1]), 0)]

    claim, reported = _race(rt, db, "revruns", (runs[0], 0), [first, second], [
        {"run_id": str(runs[1]), "step_slug": "each", "task_index": 0, "output": "b"},
        {"run_id": str(runs[0]), "step_slug": "each", "task_index": 0, "output": "a"},
    ])

    assert "error" not in claim, claim
    assert "error" not in reported, reported
    assert sorted(reported["value"]) == sorted([(runs[0], 0, "completed"), (runs[1], 0, "completed")])
    _assert_one_went_first(claim["value"])
    for run in runs:
        assert rt.steps(run)["each"]["remaining_tasks"] == 2
    assert first not in {m["msg_id"] for m in rt.messages(rt.queue("revruns"))}
    assert second not in {m["msg_id"] for m in rt.messages(rt.queue("revruns"))}

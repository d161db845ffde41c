"""Mixed batches: the whole batch is classified before anything changes.

Without a fatal message, every class is handled in the same call (claim, defer duplicates,
archive late and foreign messages). One fatal message stops the whole batch: the valid tasks stay
queued with no attempt used, nothing is archived, everything is visible again.
"""

from __future__ import annotations

import json
import uuid

from tests.claim.helpers import assert_fatal, assert_no_body

SECRET = "body-secret-" + uuid.uuid4().hex


def _mixed(cl):
    """A batch with one message of every non-fatal class; returns (batch, ids by class, run)."""
    cl.flow("mix", [{"slug": "each", "step_type": "map"}, {"slug": "one"}])
    run = cl.start("mix", [1, 2, 3])
    early = cl.worker("mix")
    started, queued1, queued2 = (cl.task(run, "each", i)["message_id"] for i in range(3))
    done = cl.task(run, "one")["message_id"]
    assert len(cl.claim("mix", [started, done], early, "mix").claimed) == 2
    cl.complete(run, "one", 0, "ok")
    cl.restore("mix", [done])  # a late copy of a completed task's message
    cl.make_visible("mix", [started])  # a started task's message seen again
    foreign = cl.send("mix", {"hello": "world", "note": SECRET})
    batch = cl.read("mix")
    assert sorted(batch) == sorted([started, queued1, queued2, done, foreign])
    ids = {"claimed": [queued1, queued2], "duplicate": [started], "archived_terminal": [done],
           "archived_foreign": [foreign], "missing": [98765]}
    return batch + [98765], ids, run


def test_every_non_fatal_class_is_handled_in_one_call(cl):
    batch, ids, run = _mixed(cl)
    worker = cl.worker("mix")

    result = cl.claim("mix", batch, worker, "mix")

    for outcome, expected in ids.items():
        assert result.ids(outcome) == sorted(expected), outcome
    assert [r["message_id"] for r in result.rows] == sorted(batch)
    assert {(r["step_slug"], r["task_index"]) for r in result.claimed} == {("each", 1), ("each", 2)}
    assert [r["input"] for r in sorted(result.claimed, key=lambda r: r["task_index"])] == [2, 3]
    for i in (1, 2):
        assert (cl.task(run, "each", i)["status"], cl.task(run, "each", i)["last_worker_id"]) == ("started", worker)
    assert cl.task(run, "each", 0)["attempts_count"] == 1  # the duplicate used no attempt
    assert sorted(cl.archived("mix")) == sorted(ids["archived_terminal"] + ids["archived_foreign"])
    [warning] = result.warnings()
    assert str(ids["archived_foreign"][0]) in warning.message
    assert_no_body([n.text() for n in result.notices], [SECRET])
    assert cl.function_row("mix-worker")["enabled"] is True


def test_one_fatal_message_stops_the_whole_batch(cl):
    batch, ids, run = _mixed(cl)
    ghost = uuid.uuid4()
    fatal_msg = cl.send("mix", json.dumps({"flow_slug": "mix", "run_id": str(ghost), "step_slug": "each",
                                           "task_index": 7}))
    batch = cl.read("mix") + batch  # the fatal message was read by the same poll
    worker = cl.worker("mix", function="mix-late-fn")
    before = cl.snapshot()

    result = cl.claim("mix", batch, worker, "mix")

    assert_fatal(cl, result, before=before, queue="mix", batch=sorted(batch), fatal={fatal_msg: "task_missing"},
                 worker_id=worker, function="mix-late-fn", secrets=[SECRET, str(ghost)])
    # in particular: the valid tasks stay queued with no attempt used, the late and the foreign
    # messages are not archived, the started task keeps its attempt and its worker
    for i in (1, 2):
        task = cl.task(run, "each", i)
        assert (task["status"], task["attempts_count"], task["last_worker_id"]) == ("queued", 0, None)
    assert cl.archived("mix") == []
    assert cl.task(run, "each", 0)["attempts_count"] == 1

    # The operator removes the message behind the stop and resumes the function; the same
    # messages are then handled normally by a new worker of that function.
    cl.conn.execute("SELECT pgmq.archive('mix', %s::bigint)", (fatal_msg,))
    cl.conn.execute("UPDATE pgflow.worker_functions SET enabled = true WHERE function_name = 'mix-late-fn'")
    again = cl.claim("mix", cl.read("mix"), cl.worker("mix", function="mix-late-fn"), "mix")
    for outcome, expected in ids.items():
        if outcome != "missing":
            assert again.ids(outcome) == sorted(expected), outcome


def test_several_fatal_messages_are_all_named(cl):
    cl.flow("mix", [{"slug": "a"}])
    cl.start("mix", {})
    worker = cl.worker("mix")
    missing = cl.send("mix", {"flow_slug": "mix", "run_id": str(uuid.uuid4()), "step_slug": "a", "task_index": 0})
    other = cl.send("mix", {"flow_slug": "elsewhere", "run_id": str(uuid.uuid4()), "step_slug": "a", "task_index": 0})
    partial = cl.send("mix", {"step_slug": "a"})
    batch = cl.read("mix")
    before = cl.snapshot()
    result = cl.claim("mix", batch, worker, "mix")
    assert_fatal(cl, result, before=before, queue="mix", batch=batch, worker_id=worker, function="mix-worker",
                 fatal={missing: "task_missing", other: "work_for_another_flow", partial: "ambiguous_message"})

"""Queue identity: (queue_name, message_id), the immutable task snapshot, and every path using it.

To show that a path reads the snapshot and not the flow slug, some tests reroute a step by
hand (``UPDATE pgflow.steps SET queue_name``; steps carry no immutability trigger). New tasks
of that step then live in another queue than ``lower(flow_slug)``, while older tasks of the
same flow keep theirs, with the same message ids.
"""

from __future__ import annotations

import uuid

import pytest

from tests.runtime.driver import raises_sqlstate
from tests.stage1.conftest import primary

TOLERANCE = 1.5


def test_snapshot_is_set_on_send_and_equals_the_route(rt):
    rt.flow("Snap", [{"slug": "a"}, {"slug": "each", "deps": ["a"], "step_type": "map"}])
    run = rt.start("Snap", {})
    [a] = rt.tasks(run)
    assert a["queue_name"] == "snap"
    [claimed] = rt.poll("Snap")
    rt.complete(run, "a", 0, [1, 2, 3])  # the map's tasks are sent now, when it starts
    tasks = rt.rows(
        """
        SELECT t.step_slug, t.task_index, t.queue_name, s.queue_name AS route, t.message_id
        FROM pgflow.step_tasks t JOIN pgflow.steps s USING (flow_slug, step_slug)
        WHERE t.run_id = %s ORDER BY t.step_slug, t.task_index
        """,
        (run,),
    )
    assert [(t["step_slug"], t["task_index"]) for t in tasks] == [("a", 0), ("each", 0), ("each", 1), ("each", 2)]
    assert {(t["queue_name"], t["route"]) for t in tasks} == {("snap", "snap")}
    # every live task's message is in that queue under that id, and its body names the task
    by_id = {m["msg_id"]: m["message"] for m in rt.messages("snap")}
    for t in tasks[1:]:
        assert by_id[t["message_id"]] == {"flow_slug": "Snap", "run_id": str(run), "step_slug": "each",
                                          "task_index": t["task_index"]}
    assert claimed["msg_id"] == tasks[0]["message_id"]


def test_snapshot_cannot_change(rt):
    rt.flow("frozen", [{"slug": "a"}])
    run = rt.start("frozen", {})
    with raises_sqlstate("55000") as caught:
        rt.conn.execute("UPDATE pgflow.step_tasks SET queue_name = 'elsewhere' WHERE run_id = %s", (run,))
    assert primary(caught.error) == f'step_tasks.queue_name is an immutable snapshot: task {run}/a/0 stays in queue "frozen"'
    assert rt.task(run, "a")["queue_name"] == "frozen"
    # writing the same value, or any other column, is allowed
    rt.conn.execute("UPDATE pgflow.step_tasks SET queue_name = 'frozen', error_message = 'x' WHERE run_id = %s", (run,))
    with raises_sqlstate("55000"):  # NULL is a change too
        rt.conn.execute("UPDATE pgflow.step_tasks SET queue_name = NULL WHERE run_id = %s", (run,))
    rt.conn.execute("UPDATE pgflow.step_tasks SET error_message = NULL WHERE run_id = %s", (run,))


def test_queue_and_message_id_are_unique_together(rt):
    rt.flow("one", [{"slug": "each", "step_type": "map"}])
    rt.flow("two", [{"slug": "each", "step_type": "map"}])
    run_one = rt.start("one", [1, 2])
    run_two = rt.start("two", [1, 2])
    # each queue numbers its messages from 1: the same message id in two queues is two messages
    assert [t["message_id"] for t in rt.tasks(run_one)] == [t["message_id"] for t in rt.tasks(run_two)] == [1, 2]
    with raises_sqlstate("23505", "idx_step_tasks_queue_message"):
        rt.conn.execute("UPDATE pgflow.step_tasks SET message_id = 1 WHERE run_id = %s AND task_index = 1", (run_one,))
    # a claim by (queue, message id) finds exactly the task of that queue
    [claimed] = rt.claim("two", [2])
    assert (claimed["run_id"], claimed["task_index"]) == (run_two, 1)
    assert [t["status"] for t in rt.tasks(run_one)] == ["queued", "queued"]


def test_protocol_1_claim_is_refused_and_claims_nothing(rt):
    rt.flow("oldclaim", [{"slug": "a"}])
    run = rt.start("oldclaim", {})
    [msg] = rt.read("oldclaim")
    with raises_sqlstate("PF002") as caught:
        rt.conn.execute("SELECT * FROM pgflow.start_tasks('oldclaim', %s, %s)", ([msg["msg_id"]], rt.worker))
    assert "speaks pgflow protocol 1 (start_tasks), database speaks protocol 2: nothing was claimed" in primary(caught.error)
    assert "pgflow.claim_tasks" in caught.error.diag.message_hint
    task = rt.task(run, "a")
    assert (task["status"], task["attempts_count"], task["last_worker_id"]) == ("queued", 0, None)
    assert rt.vt_in("oldclaim", msg["msg_id"]) == pytest.approx(30, abs=TOLERANCE)  # still the read's visibility


def _reroute(rt, flow: str, queue: str) -> None:
    rt.conn.execute("SELECT pgmq.create(%s)", (queue,))
    rt.conn.execute("UPDATE pgflow.steps SET queue_name = %s WHERE flow_slug = %s", (queue, flow))


def _hand_start(rt, run, step: str, index: int | None = None, *, age: int = 0) -> None:
    """Mark queued tasks started as a claim would (claim_tasks refuses a queue its route does not own)."""
    rt.conn.execute(
        "UPDATE pgflow.step_tasks SET status = 'started', attempts_count = attempts_count + 1, "
        "started_at = now() - make_interval(secs => %s), queued_at = now() - make_interval(secs => %s) "
        "WHERE run_id = %s AND step_slug = %s AND (%s::int IS NULL OR task_index = %s) AND status = 'queued'",
        (age, age, run, step, index, index),
    )


def test_every_message_path_follows_the_snapshot_not_the_flow_slug(rt):
    """send, retry visibility, completion archive, cancellation archive and late reports all use (queue_name, message_id)."""
    rt.flow("routed", [{"slug": "a"}, {"slug": "b"}], max_attempts=2, base_delay=5)
    old_run = rt.start("routed", {})  # tasks in queue "routed", message ids 1 and 2
    _reroute(rt, "routed", "detour")
    run = rt.start("routed", {})  # send: the new route, message ids 1 and 2 again
    assert [(t["step_slug"], t["queue_name"], t["message_id"]) for t in rt.tasks(run)] == [("a", "detour", 1), ("b", "detour", 2)]
    assert [(t["queue_name"], t["message_id"]) for t in rt.tasks(old_run)] == [("routed", 1), ("routed", 2)]
    assert len(rt.messages("detour")) == 2

    # claim by (queue, id): messages 1 and 2 of queue "routed" are the old run's tasks
    claimed = rt.poll("routed")
    assert {(t["run_id"], t["step_slug"]) for t in claimed} == {(old_run, "a"), (old_run, "b")}
    assert [t["status"] for t in rt.tasks(run)] == ["queued", "queued"]
    routed_vt = {m["msg_id"]: rt.vt_in("routed", m["msg_id"]) for m in rt.messages("routed")}

    _hand_start(rt, run, "a")
    _hand_start(rt, run, "b")
    rt.fail(run, "a", 0, "retry")  # retry: vt = 5 * 2^1 on detour message 1 only
    assert rt.task(run, "a")["status"] == "queued"
    assert rt.vt_in("detour", 1) == pytest.approx(10, abs=TOLERANCE)
    assert rt.complete(run, "b", 0, "B")["status"] == "completed"  # archive detour message 2 only
    assert [m["msg_id"] for m in rt.archived("detour")] == [2]
    assert [m["msg_id"] for m in rt.messages("detour")] == [1]
    assert rt.archived("routed") == []
    for msg_id, vt in routed_vt.items():  # the old run's messages with the same ids are untouched
        assert rt.vt_in("routed", msg_id) == pytest.approx(vt, abs=TOLERANCE)

    _hand_start(rt, run, "a")
    rt.fail(run, "a", 0, "exhausted")  # the run fails: archive detour message 1
    assert rt.run(run)["status"] == "failed"
    assert rt.messages("detour") == []
    assert sorted(m["msg_id"] for m in rt.archived("detour")) == [1, 2]
    assert len(rt.messages("routed")) == 2
    assert rt.complete(run, "a", 0, "late")["status"] == "failed"  # a late report changes nothing

    # the old run finishes normally in its own queue
    for t in claimed:
        rt.complete(old_run, t["step_slug"], 0, t["step_slug"])
    assert rt.run(old_run)["status"] == "completed"
    assert rt.messages("routed") == []
    assert sorted(m["msg_id"] for m in rt.archived("routed")) == [1, 2]
    rt.conn.execute("UPDATE pgflow.steps SET queue_name = 'routed' WHERE flow_slug = 'routed'")


def test_recovery_skip_and_helpers_follow_the_snapshot(rt):
    rt.flow("heal", [
        {"slug": "slow", "timeout": 5},
        {"slug": "each", "step_type": "map", "when_exhausted": "skip", "max_attempts": 1},
    ])
    old_run = rt.start("heal", [10, 20])
    _reroute(rt, "heal", "healer")
    run = rt.start("heal", [10, 20])
    ids = {(t["step_slug"], t["task_index"]): t["message_id"] for t in rt.tasks(run)}
    assert ids == {(t["step_slug"], t["task_index"]): t["message_id"] for t in rt.tasks(old_run)}  # same ids, two queues
    rt.conn.execute("SELECT pgmq.set_vt('heal', id, 300) FROM unnest(%s::bigint[]) AS id", (list(ids.values()),))
    slow = ids[("slow", 0)]

    # stalled recovery: effective timeout 5 + 30 s; the message becomes visible again in "healer"
    _hand_start(rt, run, "slow", age=36)
    rt.conn.execute("SELECT pgmq.set_vt('healer', %s::bigint, 300)", (slow,))
    assert rt.val("SELECT pgflow.requeue_stalled_tasks()") == 1
    assert rt.task(run, "slow")["status"] == "queued"
    assert rt.vt_in("healer", slow) <= 0.1
    assert rt.vt_in("heal", slow) == pytest.approx(300, abs=TOLERANCE)

    # skip: one map task exhausts with when_exhausted = skip; its sibling's message is archived too
    _hand_start(rt, run, "each")
    rt.fail(run, "each", 0, "skip it")
    assert rt.statuses(run)["each"] == "skipped"
    assert sorted(m["msg_id"] for m in rt.archived("healer")) == sorted([ids[("each", 0)], ids[("each", 1)]])
    assert rt.archived("heal") == []
    assert sorted(m["msg_id"] for m in rt.messages("heal")) == sorted(ids.values())

    # the helpers, called directly, change each task's message in its own queue
    keys = ([old_run, run], ["slow", "slow"], [0, 0])
    assert rt.val("SELECT pgflow._set_task_messages_vt(%s::uuid[], %s, %s, ARRAY[100, 200])", keys) == 2
    assert rt.vt_in("heal", slow) == pytest.approx(100, abs=TOLERANCE)
    assert rt.vt_in("healer", slow) == pytest.approx(200, abs=TOLERANCE)

    # finish both runs; the invariants then hold for both queues
    for r, queue in ((old_run, "heal"), (run, "healer")):
        for t in rt.tasks(r):
            if t["status"] == "queued":
                _hand_start(rt, r, t["step_slug"], t["task_index"])
                rt.complete(r, t["step_slug"], t["task_index"], t["task_index"])
        assert rt.run(r)["status"] == "completed", queue
        assert rt.messages(queue) == []
    rt.conn.execute("UPDATE pgflow.steps SET queue_name = 'heal' WHERE flow_slug = 'heal'")


def test_claim_fatal_for_a_route_the_worker_does_not_own(rt):
    """A rerouted step's task cannot be claimed by the flow's plain worker: wrong route is fatal, nothing changes."""
    rt.flow("owned", [{"slug": "a"}])
    _reroute(rt, "owned", "foreign_q")
    run = rt.start("owned", {})
    [msg] = rt.read("foreign_q")
    worker = uuid.uuid4()
    rt.conn.execute("SELECT pgflow.register_worker(%s, 'owned-fn', 'any', NULL)", (worker,))
    rows = rt.claim_outcomes("owned", [msg["msg_id"]], worker, queue="foreign_q")
    assert [(r["outcome"], r["reason"]) for r in rows] == [("fatal", "queue_not_owned_by_route")]
    task = rt.task(run, "a")
    assert (task["status"], task["attempts_count"]) == ("queued", 0)
    assert rt.vt_in("foreign_q", msg["msg_id"]) <= 0.1  # released
    assert rt.val("SELECT enabled FROM pgflow.worker_functions WHERE function_name = 'owned-fn'") is False
    rt.conn.execute("UPDATE pgflow.steps SET queue_name = 'owned' WHERE flow_slug = 'owned'")

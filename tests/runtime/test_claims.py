"""Claims: visibility = effective timeout + 2 s, the claim-rollback guard, duplicates, start delay.

Most tests run on both levels through the driver (start_tasks on the baseline, claim_tasks on
the upgraded schema). The races that call ``pgflow.start_tasks`` by name are baseline-only;
each has a claim_tasks counterpart below it that also checks the classified outcomes.
"""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest

from tests.runtime.driver import raises_sqlstate, wait_until_blocked

TOLERANCE = 1.5  # seconds of slack when comparing a vt with the clock
START_TASKS = "start_tasks(flow_slug, msg_ids, worker_id) is the protocol-1 claim; 0003 refuses it with PF002"


def test_claim_sets_visibility_to_effective_timeout_plus_two(rt):
    rt.flow("vis", [{"slug": "flowdefault"}, {"slug": "ownstep", "timeout": 7}], timeout=45)
    rt.start("vis", {})
    claimed = {t["step_slug"]: t for t in rt.poll("vis")}
    assert set(claimed) == {"flowdefault", "ownstep"}
    assert rt.vt_in("vis", claimed["flowdefault"]["msg_id"]) == pytest.approx(47, abs=TOLERANCE)
    assert rt.vt_in("vis", claimed["ownstep"]["msg_id"]) == pytest.approx(9, abs=TOLERANCE)


def test_claim_records_attempt_worker_and_start(rt):
    rt.flow("attempt", [{"slug": "a"}])
    run = rt.start("attempt", {})
    before = rt.task(run, "a")
    assert (before["status"], before["attempts_count"], before["last_worker_id"]) == ("queued", 0, None)
    rt.poll("attempt")
    after = rt.task(run, "a")
    assert after["status"] == "started"
    assert after["attempts_count"] == 1
    assert after["last_worker_id"] == rt.worker_for("attempt")
    assert after["started_at"] is not None


def _map_with_a_deleted_message(rt):
    """A root map "guard" of 2 tasks whose first message someone deletes behind pgflow's back:
    ``(run, both messages as read)``."""
    rt.flow("guard", [{"slug": "each", "step_type": "map"}])
    run = rt.start("guard", [1, 2])
    msgs = rt.read("guard")
    assert len(msgs) == 2
    rt.conn.execute("SELECT pgmq.delete('guard', %s::bigint)", (msgs[0]["msg_id"],))
    return run, msgs


@pytest.mark.baseline_only(
    reason="start_tasks claims first and then finds the message gone; claim_tasks classifies a vanished "
    "message as 'missing' before changing anything (upgraded counterparts below)"
)
def test_claim_rolls_back_when_a_message_vanished(rt):
    """The visibility guard: fewer messages changed than tasks claimed -> raise, nothing consumed."""
    run, msgs = _map_with_a_deleted_message(rt)
    with pytest.raises(psycopg.errors.RaiseException, match=r"visibility updated 1 of 2 claimed messages"):
        rt.claim("guard", [m["msg_id"] for m in msgs])
    for task in rt.tasks(run):
        assert task["status"] == "queued"
        assert task["attempts_count"] == 0
        assert task["last_worker_id"] is None
    # The surviving message's visibility is untouched by the rolled-back claim (still the read's 30 s).
    assert rt.vt_in("guard", msgs[1]["msg_id"]) == pytest.approx(30, abs=TOLERANCE)
    # A task without its message can never be claimed again; that is the broken state we created.
    rt.require_live_messages = False


def test_duplicate_delivery_does_not_consume_an_attempt(rt):
    rt.flow("dup", [{"slug": "a"}])
    run = rt.start("dup", {})
    [msg] = rt.read("dup")
    assert len(rt.claim("dup", [msg["msg_id"]])) == 1
    assert rt.claim("dup", [msg["msg_id"]]) == []  # already started
    assert rt.task(run, "a")["attempts_count"] == 1


def test_claim_only_touches_the_named_flow(rt):
    rt.flow("one", [{"slug": "a"}])
    rt.flow("two", [{"slug": "a"}])
    run_one = rt.start("one", {})
    run_two = rt.start("two", {})
    [m_two] = rt.read("two")
    # Each queue numbers its messages from 1, so both tasks carry message id 1: the flow slug
    # (the baseline queue) is what keeps the claim inside flow two.
    assert rt.task(run_one, "a")["message_id"] == m_two["msg_id"]
    assert rt.claim("two", [m_two["msg_id"]])[0]["run_id"] == run_two
    assert rt.task(run_one, "a")["status"] == "queued"
    assert rt.claim("two", [12345]) == []


@pytest.mark.baseline_only(
    reason="start_tasks ignores a flow it does not know; claim_tasks treats a route to an unknown flow as "
    "fatal unsupported work (test_claim_for_an_unknown_flow_is_fatal_and_changes_nothing)"
)
def test_claim_ignores_unknown_flows_and_empty_batches(rt):
    assert rt.claim("nosuchflow", [1, 2]) == []
    assert rt.claim("nosuchflow", []) == []


def test_start_delay_keeps_message_invisible(rt):
    rt.flow("delayed", [{"slug": "now"}, {"slug": "later", "start_delay": 30}])
    run = rt.start("delayed", {})
    visible = rt.read("delayed")
    assert [m["message"]["step_slug"] for m in visible] == ["now"]
    later = rt.task(run, "later")
    assert later["status"] == "queued"
    assert rt.vt_in("delayed", later["message_id"]) == pytest.approx(30, abs=TOLERANCE)


def test_start_delay_of_a_dependent_step_counts_from_its_start(rt):
    rt.flow("delaydep", [{"slug": "a"}, {"slug": "b", "deps": ["a"], "start_delay": 20}])
    run = rt.start("delaydep", {})
    rt.poll("delaydep")
    rt.complete(run, "a", 0, 1)
    assert rt.read("delaydep") == []
    assert rt.vt_in("delaydep", rt.task(run, "b")["message_id"]) == pytest.approx(20, abs=TOLERANCE)


def test_claim_of_task_in_failed_run_is_refused(rt):
    rt.flow("refuse", [{"slug": "a"}, {"slug": "b"}], max_attempts=1)
    run = rt.start("refuse", {})
    msgs = {m["message"]["step_slug"]: m["msg_id"] for m in rt.read("refuse")}
    rt.claim("refuse", [msgs["a"]])
    rt.fail(run, "a", 0, "fatal")
    assert rt.run(run)["status"] == "failed"
    assert rt.claim("refuse", [msgs["b"]]) == []
    assert rt.task(run, "b")["status"] == "cancelled"


def _in_thread(fn):
    """Run ``fn`` in a thread; its return value or exception ends up in the returned dict."""
    result: dict = {}

    def target():
        try:
            result["value"] = fn()
        except Exception as exc:  # surfaced by the caller
            result["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    return thread, result


def _finish(thread, result) -> object:
    thread.join(30)
    assert not thread.is_alive(), "the blocked call never finished"
    assert "error" not in result, result.get("error")
    return result["value"]


def _register(rt, function: str, slug: str) -> uuid.UUID:
    """A second worker of flow ``slug`` with its real route (both levels accept it)."""
    wid = uuid.uuid4()
    rt.conn.execute("SELECT pgflow.register_worker(%s, %s, %s, %s)", (wid, function, rt.queue(slug), slug))
    return wid


def _while_held(rt, holder: psycopg.Connection, waiter: psycopg.Connection, call) -> object:
    """Run ``call()`` (a statement on ``waiter``) in a thread, wait until ``waiter`` waits for a lock,
    commit ``holder``, and return what ``call`` returned."""
    thread, result = _in_thread(call)
    wait_until_blocked(rt.conn, waiter.info.backend_pid)
    holder.commit()
    return _finish(thread, result)


def _map_claim_race(rt, db, slug: str, items: int, other_function: str):
    """A root map of ``items`` tasks, its message ids, a second registered worker and two
    connections for the two claims: ``(run, ids, other_worker, first, second)``."""
    rt.flow(slug, [{"slug": "each", "step_type": "map"}])
    run = rt.start(slug, list(range(items)))
    ids = [m["msg_id"] for m in rt.read(slug)]
    other = _register(rt, other_function, slug)
    return run, ids, other, db.connect(autocommit=False), db.connect(autocommit=False)


def _run_with_a_claimed(rt, slug: str):
    """Two root steps a and b (one attempt each), a claimed: ``(run, {step: msg_id})``."""
    rt.flow(slug, [{"slug": "a"}, {"slug": "b"}], max_attempts=1)
    run = rt.start(slug, {})
    msgs = {m["message"]["step_slug"]: m["msg_id"] for m in rt.read(slug)}
    rt.claim(slug, [msgs["a"]])
    return run, msgs


def _fail_a_while_b_is_claimed(rt, db, slug: str, run, claiming: psycopg.Connection) -> dict:
    """a fails while ``claiming`` holds its open claim of b: fail_task waits for the claim's share
    lock on the run, then fails the run and cancels b, whose message is gone; the worker that
    claimed b reports later and nothing changes. Returns b's task row before that late report."""
    failer = db.connect()
    _while_held(rt, claiming, failer,
                lambda: failer.execute("SELECT status FROM pgflow.fail_task(%s, 'a', 0, 'x')", (run,)).fetchall())
    assert rt.run(run)["status"] == "failed"
    b = rt.task(run, "b")
    assert rt.messages(slug) == []
    assert rt.complete(run, "b", 0, "late")["status"] == "cancelled"
    return b


# -- races with start_tasks (baseline) -----------------------------------------------------------


@pytest.mark.baseline_only(reason=START_TASKS)
def test_concurrent_claims_never_hand_out_a_task_twice(rt, db):
    """Two workers claim the same message ids at the same time: exactly one gets each task."""
    run, ids, w2, c1, c2 = _map_claim_race(rt, db, "race", 20, "w2")
    first = c1.execute("SELECT task_index FROM pgflow.start_tasks('race', %s, %s)", (ids, rt.worker)).fetchall()

    def claim_second():
        rows = c2.execute("SELECT task_index FROM pgflow.start_tasks('race', %s, %s)", (ids, w2)).fetchall()
        c2.commit()
        return rows

    assert _while_held(rt, c1, c2, claim_second) == []  # c2 waits for c1's task row locks
    assert len(first) == 20
    assert {t["attempts_count"] for t in rt.tasks(run)} == {1}


@pytest.mark.baseline_only(reason=START_TASKS)
def test_claim_waits_for_a_failing_run_and_then_claims_nothing(rt, db):
    """#645 race: a claim arriving while the run is being failed must not start a cancelled task."""
    run, msgs = _run_with_a_claimed(rt, "racefail")
    failing = db.connect(autocommit=False)
    failing.execute("SELECT * FROM pgflow.fail_task(%s, 'a', 0, 'fatal')", (run,))

    claimer = db.connect()
    claimed = _while_held(  # the claim waits for the run's failure
        rt, failing, claimer,
        lambda: claimer.execute("SELECT * FROM pgflow.start_tasks('racefail', %s, %s)", ([msgs["b"]], rt.worker)).fetchall())
    assert claimed == []
    b = rt.task(run, "b")
    assert (b["status"], b["attempts_count"]) == ("cancelled", 0)


@pytest.mark.baseline_only(reason=START_TASKS)
def test_failure_waits_for_an_in_flight_claim_and_then_cancels_it(rt, db):
    run, msgs = _run_with_a_claimed(rt, "raceclaim")
    claiming = db.connect(autocommit=False)
    claimed = claiming.execute("SELECT * FROM pgflow.start_tasks('raceclaim', %s, %s)", ([msgs["b"]], rt.worker)).fetchall()
    assert len(claimed) == 1

    b = _fail_a_while_b_is_claimed(rt, db, "raceclaim", run, claiming)
    assert b["status"] == "cancelled"


@pytest.mark.baseline_only(reason=START_TASKS)
def test_overlapping_claims_split_the_tasks_without_double_claims(rt, db):
    """A second claim over partly the same messages (listed in reverse) waits, then takes only the rest."""
    run, ids, other, first, second = _map_claim_race(rt, db, "overlap", 6, "w-other")
    got_first = first.execute("SELECT task_index FROM pgflow.start_tasks('overlap', %s, %s)", (ids[:4], rt.worker)).fetchall()
    got_second = _while_held(
        rt, first, second,
        lambda: second.execute("SELECT task_index FROM pgflow.start_tasks('overlap', %s, %s)", (list(reversed(ids)), other)).fetchall()
    )
    claimed_second = sorted(r[0] for r in got_second)
    second.commit()
    assert sorted(r[0] for r in got_first) == [0, 1, 2, 3]
    assert claimed_second == [4, 5]
    assert {t["attempts_count"] for t in rt.tasks(run)} == {1}


# -- the same races with claim_tasks (upgraded) ----------------------------------------------------

CLAIM_TASKS = "claim_tasks is the protocol-2 claim (0003); the baseline counterpart uses start_tasks"


def _outcomes(rows) -> list[tuple]:
    return [(r["outcome"], r["reason"], r["step_slug"], r["task_index"]) for r in rows]


@pytest.mark.upgraded_only(reason=CLAIM_TASKS)
def test_concurrent_claim_tasks_never_hand_out_a_task_twice(rt, db):
    """Same ids, two workers: the second waits, then sees 20 started tasks as duplicates, no attempt used."""
    run, ids, w2, c1, c2 = _map_claim_race(rt, db, "race", 20, "w2")
    w1 = rt.worker_for("race")
    first = rt.claim_outcomes("race", ids, w1, conn=c1)

    def claim_second():
        rows = rt.claim_outcomes("race", ids, w2, conn=c2)
        c2.commit()
        return rows

    second = _while_held(rt, c1, c2, claim_second)  # c2 waits for c1's task row locks
    assert sorted(r["task_index"] for r in first if r["outcome"] == "claimed") == list(range(20))
    assert len(first) == 20
    assert _outcomes(second) == [("duplicate", "task_started", "each", i) for i in range(20)]
    tasks = rt.tasks(run)
    assert {t["attempts_count"] for t in tasks} == {1}
    assert {t["last_worker_id"] for t in tasks} == {w1}
    # a duplicate defers the message toward the task's recovery deadline (started_at + 60 s + 30 s)
    assert rt.vt_in("race", ids[0]) == pytest.approx(90, abs=TOLERANCE)


@pytest.mark.upgraded_only(reason=CLAIM_TASKS)
def test_claim_tasks_waits_for_a_failing_run_and_then_claims_nothing(rt, db):
    """#645 race on protocol 2: the claim waits, then finds b cancelled and archives its message idempotently."""
    run, msgs = _run_with_a_claimed(rt, "racefail")
    worker = rt.worker_for("racefail")
    failing = db.connect(autocommit=False)
    failing.execute("SELECT * FROM pgflow.fail_task(%s, 'a', 0, 'fatal')", (run,))

    claimer = db.connect()
    [row] = _while_held(rt, failing, claimer, lambda: rt.claim_outcomes("racefail", [msgs["b"]], worker, conn=claimer))
    # Not claimed: depending on whether the claim read b's message before or after the failure
    # archived it, it is the late message of a terminal task or already gone. Both are benign.
    assert (row["outcome"], row["reason"], row["step_slug"]) in {
        ("archived_terminal", "task_cancelled", "b"),
        ("missing", "message_gone_task_exists", "b"),
    }
    b = rt.task(run, "b")
    assert (b["status"], b["attempts_count"], b["last_worker_id"]) == ("cancelled", 0, None)
    assert rt.messages("racefail") == []
    assert sorted(m["msg_id"] for m in rt.archived("racefail")) == sorted(msgs.values())


@pytest.mark.upgraded_only(reason=CLAIM_TASKS)
def test_failure_waits_for_an_in_flight_claim_tasks_and_then_cancels_it(rt, db):
    run, msgs = _run_with_a_claimed(rt, "raceclaim")
    claiming = db.connect(autocommit=False)
    claimed = rt.claim_outcomes("raceclaim", [msgs["b"]], rt.worker_for("raceclaim"), conn=claiming)
    assert _outcomes(claimed) == [("claimed", None, "b", 0)]

    b = _fail_a_while_b_is_claimed(rt, db, "raceclaim", run, claiming)
    assert (b["status"], b["attempts_count"]) == ("cancelled", 1)


@pytest.mark.upgraded_only(reason=CLAIM_TASKS)
def test_overlapping_claim_tasks_split_the_tasks_without_double_claims(rt, db):
    run, ids, other, first, second = _map_claim_race(rt, db, "overlap", 6, "w-other")
    w1 = rt.worker_for("overlap")
    got_first = rt.claim_outcomes("overlap", ids[:4], w1, conn=first)
    got_second = _while_held(rt, first, second, lambda: rt.claim_outcomes("overlap", list(reversed(ids)), other, conn=second))
    second.commit()
    assert _outcomes(got_first) == [("claimed", None, "each", i) for i in range(4)]
    assert _outcomes(got_second) == (
        [("duplicate", "task_started", "each", i) for i in range(4)] + [("claimed", None, "each", i) for i in (4, 5)]
    )
    assert {t["attempts_count"] for t in rt.tasks(run)} == {1}


@pytest.mark.upgraded_only(reason="claim_tasks classifies every message before changing anything")
def test_claim_classifies_a_vanished_message_as_missing(rt):
    """Counterpart of the baseline guard test: a message deleted before the claim is 'missing'; the rest is claimed."""
    run, msgs = _map_with_a_deleted_message(rt)
    rows = rt.claim_outcomes("guard", [m["msg_id"] for m in msgs])
    assert _outcomes(rows) == [("missing", "message_gone_task_exists", "each", 0), ("claimed", None, "each", 1)]
    tasks = rt.tasks(run)
    assert [(t["status"], t["attempts_count"]) for t in tasks] == [("queued", 0), ("started", 1)]
    assert rt.vt_in("guard", msgs[1]["msg_id"]) == pytest.approx(62, abs=TOLERANCE)
    rt.require_live_messages = False  # task 0 has no message any more: the broken state we created


@pytest.mark.upgraded_only(reason="the claim_tasks visibility guard")
@pytest.mark.parametrize("read_vt", [30, 62], ids=["visibility-set", "visibility-kept"])
def test_a_message_that_vanishes_while_the_claim_waits_for_it_is_missing_and_nothing_is_consumed(rt, db, read_vt):
    """The claim locks the batch's messages when it reads them (after the task locks): a message
    someone holds and deletes meanwhile is gone when the claim gets it, so it is ``missing``, the
    task stays queued with no attempt used, whether the claim would have set the visibility (a 30 s
    read) or kept the read's (62 s: the default timeout + 2 s). A claimed message is locked from its
    read on, so it cannot vanish before the claim commits (the claim's visibility guard stays as a
    check that cannot fire).
    """
    rt.flow("midguard", [{"slug": "a"}])
    run = rt.start("midguard", {})
    [msg] = rt.read("midguard", vt=read_vt)
    worker = rt.worker_for("midguard")
    holder = db.connect(autocommit=False)
    holder.execute("SELECT 1 FROM pgmq.q_midguard WHERE msg_id = %s FOR UPDATE", (msg["msg_id"],))
    claimer = db.connect()
    thread, result = _in_thread(lambda: rt.claim_outcomes("midguard", [msg["msg_id"]], worker, conn=claimer))
    assert holder.info.backend_pid in wait_until_blocked(rt.conn, claimer.info.backend_pid)
    holder.execute("SELECT pgmq.delete('midguard', %s::bigint)", (msg["msg_id"],))
    holder.commit()
    rows = _finish(thread, result)
    assert _outcomes(rows) == [("missing", "message_gone_task_exists", "a", 0)]
    task = rt.task(run, "a")
    assert (task["status"], task["attempts_count"], task["last_worker_id"], task["started_at"]) == ("queued", 0, None, None)
    rt.require_live_messages = False  # the task's message was deleted behind pgflow's back


@pytest.mark.upgraded_only(
    reason="counterpart of test_claim_ignores_unknown_flows_and_empty_batches: a route to an unknown flow is fatal"
)
def test_claim_for_an_unknown_flow_is_fatal_and_changes_nothing(rt):
    assert rt.claim_outcomes("nosuchflow", [], uuid.uuid4()) == []  # empty batch: nothing to classify
    rt.conn.execute("SELECT pgmq.create('nosuchflow')")
    msg_id = rt.val("""SELECT pgmq.send('nosuchflow', '{"hello": "world"}')""")
    with raises_sqlstate("PF007", "is not registered"):
        rt.claim_outcomes("nosuchflow", [msg_id], uuid.uuid4())

    rows = rt.claim_outcomes("nosuchflow", [msg_id], rt.worker)  # route-less worker of function test-worker
    assert [(r["outcome"], r["message_id"], r["reason"]) for r in rows] == [("fatal", msg_id, "unknown_flow")]
    assert [m["msg_id"] for m in rt.messages("nosuchflow")] == [msg_id]  # not archived
    assert rt.archived("nosuchflow") == []
    assert rt.vt_in("nosuchflow", msg_id) <= 0.1  # the batch is visible again
    fn = rt.one("SELECT * FROM pgflow.worker_functions WHERE function_name = 'test-worker'")
    assert fn["enabled"] is False
    assert "nosuchflow" in fn["paused_reason"] and f"message {msg_id} unknown_flow" in fn["paused_reason"]
    assert "hello" not in fn["paused_reason"]  # never a message body
    assert rt.val("SELECT deprecated_at FROM pgflow.workers WHERE worker_id = %s", (rt.worker,)) is not None
    with raises_sqlstate("PF001"):
        rt.conn.execute("SELECT pgflow.register_worker(%s, 'test-worker', 'any', NULL)", (uuid.uuid4(),))

"""Claims: visibility = effective timeout + 2 s, the claim-rollback guard, duplicates, start delay."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql

TOLERANCE = 1.5  # seconds of slack when comparing a vt with the clock


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
    assert after["last_worker_id"] == rt.worker
    assert after["started_at"] is not None


def test_claim_rolls_back_when_a_message_vanished(rt):
    """The visibility guard: fewer messages changed than tasks claimed -> raise, nothing consumed."""
    rt.flow("guard", [{"slug": "each", "step_type": "map"}])
    run = rt.start("guard", [1, 2])
    msgs = rt.read("guard")
    assert len(msgs) == 2
    # Someone deletes one message behind pgflow's back.
    rt.conn.execute("SELECT pgmq.delete('guard', %s::bigint)", (msgs[0]["msg_id"],))
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


def test_concurrent_claims_never_hand_out_a_task_twice(rt, db):
    """Two workers claim the same message ids at the same time: exactly one gets each task."""
    rt.flow("race", [{"slug": "each", "step_type": "map"}])
    run = rt.start("race", list(range(20)))
    ids = [m["msg_id"] for m in rt.read("race")]
    w2 = uuid.uuid4()
    rt.conn.execute("SELECT pgflow.register_worker(%s, 'w2', 'race', 'race')", (w2,))
    c1 = db.connect(autocommit=False)
    c2 = db.connect(autocommit=False)
    first = c1.execute("SELECT task_index FROM pgflow.start_tasks('race', %s, %s)", (ids, rt.worker)).fetchall()
    # c2 blocks on c1's row locks until c1 commits; run it in a thread
    import threading

    result: dict = {}

    def claim_second():
        result["rows"] = c2.execute("SELECT task_index FROM pgflow.start_tasks('race', %s, %s)", (ids, w2)).fetchall()
        c2.commit()

    thread = threading.Thread(target=claim_second)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive(), "the second claim should wait for the first one's row locks"
    c1.commit()
    thread.join(10)
    assert len(first) == 20
    assert result["rows"] == []
    assert {t["attempts_count"] for t in rt.tasks(run)} == {1}


def _in_thread(fn):
    import threading

    result: dict = {}

    def target():
        try:
            result["value"] = fn()
        except Exception as exc:  # surfaced by the caller
            result["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    return thread, result


def test_claim_waits_for_a_failing_run_and_then_claims_nothing(rt, db):
    """#645 race: a claim arriving while the run is being failed must not start a cancelled task."""
    rt.flow("racefail", [{"slug": "a"}, {"slug": "b"}], max_attempts=1)
    run = rt.start("racefail", {})
    msgs = {m["message"]["step_slug"]: m["msg_id"] for m in rt.read("racefail")}
    rt.claim("racefail", [msgs["a"]])
    failing = db.connect(autocommit=False)
    failing.execute("SELECT * FROM pgflow.fail_task(%s, 'a', 0, 'fatal')", (run,))

    claimer = db.connect()
    thread, result = _in_thread(
        lambda: claimer.execute("SELECT * FROM pgflow.start_tasks('racefail', %s, %s)", ([msgs["b"]], rt.worker)).fetchall()
    )
    thread.join(0.5)
    assert thread.is_alive(), "the claim must wait for the run's failure to commit"
    failing.commit()
    thread.join(10)
    assert "error" not in result, result.get("error")
    assert result["value"] == []
    b = rt.task(run, "b")
    assert (b["status"], b["attempts_count"]) == ("cancelled", 0)


def test_failure_waits_for_an_in_flight_claim_and_then_cancels_it(rt, db):
    rt.flow("raceclaim", [{"slug": "a"}, {"slug": "b"}], max_attempts=1)
    run = rt.start("raceclaim", {})
    msgs = {m["message"]["step_slug"]: m["msg_id"] for m in rt.read("raceclaim")}
    rt.claim("raceclaim", [msgs["a"]])
    claiming = db.connect(autocommit=False)
    claimed = claiming.execute("SELECT * FROM pgflow.start_tasks('raceclaim', %s, %s)", ([msgs["b"]], rt.worker)).fetchall()
    assert len(claimed) == 1

    failer = db.connect()
    thread, result = _in_thread(lambda: failer.execute("SELECT status FROM pgflow.fail_task(%s, 'a', 0, 'x')", (run,)).fetchall())
    thread.join(0.5)
    assert thread.is_alive(), "fail_task must wait for the claim holding the run in share mode"
    claiming.commit()
    thread.join(10)
    assert "error" not in result, result.get("error")
    assert rt.run(run)["status"] == "failed"
    assert rt.task(run, "b")["status"] == "cancelled"
    assert rt.messages("raceclaim") == []
    # the worker that claimed b reports later: nothing changes
    assert rt.complete(run, "b", 0, "late")["status"] == "cancelled"


def test_overlapping_claims_split_the_tasks_without_double_claims(rt, db):
    """A second claim over partly the same messages (listed in reverse) waits, then takes only the rest."""
    rt.flow("overlap", [{"slug": "each", "step_type": "map"}])
    run = rt.start("overlap", list(range(6)))
    ids = [m["msg_id"] for m in rt.read("overlap")]
    other = uuid.uuid4()
    rt.conn.execute("SELECT pgflow.register_worker(%s, 'w-other', 'overlap', 'overlap')", (other,))
    first = db.connect(autocommit=False)
    second = db.connect(autocommit=False)
    got_first = first.execute("SELECT task_index FROM pgflow.start_tasks('overlap', %s, %s)", (ids[:4], rt.worker)).fetchall()
    thread, result = _in_thread(
        lambda: second.execute("SELECT task_index FROM pgflow.start_tasks('overlap', %s, %s)", (list(reversed(ids)), other)).fetchall()
    )
    thread.join(0.5)
    first.commit()
    thread.join(10)
    second.commit()
    assert "error" not in result, result.get("error")
    claimed_second = sorted(r[0] for r in result["value"])
    assert sorted(r[0] for r in got_first) == [0, 1, 2, 3]
    assert claimed_second == [4, 5]
    assert {t["attempts_count"] for t in rt.tasks(run)} == {1}

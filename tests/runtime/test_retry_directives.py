"""A handler's retry directives in the database (docs/runtime.md "Retry delay and fail-now"):
``fail_task``'s ``retry_delay_seconds`` replaces the step's backoff while attempts remain and is
ignored once they are used up; ``fail_now`` ends the task whatever attempts remain and the step's
when_exhausted applies; both are recorded on the task row; a bad directive is refused with PF013
and changes nothing; ``fail_tasks`` takes both per element; the released four-argument call is
unchanged; a directive waiting behind a claim of the same task applies to that claim's attempt.
"""

from __future__ import annotations

import pytest
from psycopg.types.json import Jsonb

from tests.runtime.driver import commit_when_blocked, raises_sqlstate
from tests.support.fingerprint import fingerprint

pytestmark = pytest.mark.upgraded_only(reason="fail_task's retry delay and fail-now exist from migration 0003 on")

TOLERANCE = 1.5
DIRECTED = "SELECT * FROM pgflow.fail_task(%s, %s, %s, %s, %s, %s)"


def _fail(rt, run, step: str, index: int, error: str, delay=None, fail_now: bool = False) -> dict:
    return rt.one(DIRECTED, (run, step, index, error, delay, fail_now))


def _element(task: dict, error: str, **directive) -> dict:
    return {"run_id": str(task["run_id"]), "step_slug": task["step_slug"], "task_index": task["task_index"],
            "error_message": error, **directive}


def test_a_retry_delay_replaces_the_backoff_while_attempts_remain(rt):
    rt.flow("later", [{"slug": "s"}], max_attempts=5, base_delay=1)
    run = rt.start("later", {})
    [task] = rt.poll("later")

    row = _fail(rt, run, "s", 0, "rate limited", 30)
    assert (row["status"], row["attempts_count"], row["error_message"]) == ("queued", 1, "rate limited")
    assert (row["requested_retry_delay"], row["failed_now"]) == (30, False)
    assert rt.vt_in("later", task["msg_id"]) == pytest.approx(30, abs=TOLERANCE)  # the backoff says 2

    rt.make_visible("later")
    rt.poll("later")
    row = _fail(rt, run, "s", 0, "again", 2.2)  # whole seconds, rounded up
    assert (row["attempts_count"], row["requested_retry_delay"]) == (2, 3)
    assert rt.vt_in("later", task["msg_id"]) == pytest.approx(3, abs=TOLERANCE)

    rt.make_visible("later")
    rt.poll("later")
    row = rt.fail(run, "s", 0, "plain")  # no directive: the backoff, floor(1 * 2^3), and no record
    assert (row["attempts_count"], row["requested_retry_delay"], row["failed_now"]) == (3, None, False)
    assert rt.vt_in("later", task["msg_id"]) == pytest.approx(8, abs=TOLERANCE)

    rt.make_visible("later")
    rt.poll("later")
    row = _fail(rt, run, "s", 0, "zero", 0)  # visible at once
    assert row["status"] == "queued" and rt.vt_in("later", task["msg_id"]) <= 0.5
    assert [t["msg_id"] for t in rt.poll("later")] == [task["msg_id"]]


def test_a_retry_delay_on_the_last_attempt_is_ignored_and_the_task_fails_as_exhausted(rt):
    rt.flow("lastdelay", [{"slug": "s"}], max_attempts=2, base_delay=0)
    run = rt.start("lastdelay", {})
    [task] = rt.poll("lastdelay")
    rt.fail(run, "s", 0, "first")
    rt.poll("lastdelay")

    row = _fail(rt, run, "s", 0, "second", 600)
    assert (row["status"], row["attempts_count"], row["error_message"]) == ("failed", 2, "second")
    assert (row["requested_retry_delay"], row["failed_now"]) == (600, False)  # recorded, not applied
    assert rt.steps(run)["s"]["status"] == "failed" and rt.run(run)["status"] == "failed"
    assert rt.messages("lastdelay") == []
    assert [m["msg_id"] for m in rt.archived("lastdelay")] == [task["msg_id"]]


@pytest.mark.parametrize("when_exhausted", ["fail", "skip", "skip-cascade"])
def test_fail_now_on_a_map_task_ends_it_at_once_and_the_steps_when_exhausted_applies(rt, when_exhausted):
    rt.flow("failnow", [{"slug": "each", "step_type": "map", "when_exhausted": when_exhausted},
                        {"slug": "after", "deps": ["each"]},
                        {"slug": "other"}], max_attempts=5, base_delay=0)
    run = rt.start("failnow", ["a", "b", "c"])
    claimed = rt.poll("failnow")
    assert len(claimed) == 4  # three map tasks and the independent root step

    row = _fail(rt, run, "each", 1, "source gone", None, True)
    assert (row["status"], row["attempts_count"], row["error_message"]) == ("failed", 1, "source gone")
    assert (row["requested_retry_delay"], row["failed_now"]) == (None, True)
    siblings = {t["task_index"]: t["status"] for t in rt.tasks(run, "each")}
    states = rt.statuses(run)
    if when_exhausted == "fail":
        assert siblings == {0: "cancelled", 1: "failed", 2: "cancelled"}
        assert (states["each"], rt.run(run)["status"]) == ("failed", "failed")
    else:
        assert siblings == {0: "skipped", 1: "failed", 2: "skipped"}
        assert states["each"] == "skipped" and rt.run(run)["status"] == "started"
        assert states["after"] == ("skipped" if when_exhausted == "skip-cascade" else "started")
    live = {m["msg_id"] for m in rt.messages("failnow")}
    assert not live & {t["msg_id"] for t in claimed if t["step_slug"] == "each"}  # the map's messages are archived


def test_fail_now_on_the_first_of_many_attempts_of_a_single_step(rt):
    rt.flow("failnowone", [{"slug": "s"}], max_attempts=10, base_delay=60)
    run = rt.start("failnowone", {})
    rt.poll("failnowone")
    row = rt.one("SELECT * FROM pgflow.fail_task(run_id => %s, step_slug => 's', task_index => 0, "
                 "error_message => 'no', retry_delay_seconds => NULL, fail_now => true)", (run,))
    assert (row["status"], row["attempts_count"], row["failed_now"]) == ("failed", 1, True)
    assert rt.run(run)["status"] == "failed" and rt.messages("failnowone") == []


@pytest.mark.parametrize(("delay", "fail_now", "match"), [
    (-1, False, r"from 0 to 2147483647, not -1"),
    ("NaN", False, r"not NaN"),
    ("Infinity", False, r"not Infinity"),
    ("-Infinity", False, r"not -Infinity"),
    (2147483648, False, r"not 2147483648"),
    (5, True, r"either sets a retry delay or fails now, not both"),
])
def test_a_bad_directive_is_refused_with_pf013_and_nothing_changes(rt, db, delay, fail_now, match):
    rt.flow("refused", [{"slug": "s"}], max_attempts=3, base_delay=1)
    run = rt.start("refused", {})
    [task] = rt.poll("refused")
    before = fingerprint(db.conninfo)

    with raises_sqlstate("PF013", rf"^fail_task\(\): .*{match}"):
        rt.one("SELECT * FROM pgflow.fail_task(%s, 's', 0, 'x', %s::double precision, %s)", (run, str(delay), fail_now))
    element = _element({"run_id": run, "step_slug": "s", "task_index": 0}, "x", fail_now=fail_now)
    element["retry_delay_seconds"] = delay if isinstance(delay, int) else None
    if element["retry_delay_seconds"] is not None:  # JSON has no NaN or infinity
        good = _element(task | {"run_id": run, "step_slug": "s", "task_index": 0}, "fine")
        with raises_sqlstate("PF013", rf"^fail_tasks\(\): element 1: fail_task\(\): .*{match}.*; nothing was applied"):
            rt.rows("SELECT * FROM pgflow.fail_tasks(%s)", (Jsonb([good, element]),))
    assert fingerprint(db.conninfo).differences(before) == []
    assert rt.task(run, "s")["status"] == "started"


@pytest.mark.parametrize(("key", "value", "problem"), [
    ("retry_delay_seconds", "20", "retry_delay_seconds is not a number or null"),
    ("fail_now", "yes", "fail_now is not true, false or null"),
])
def test_a_batch_element_with_a_directive_of_the_wrong_type_is_malformed(rt, db, key, value, problem):
    rt.flow("malformed", [{"slug": "s"}])
    run = rt.start("malformed", {})
    rt.poll("malformed")
    before = fingerprint(db.conninfo)
    bad = _element({"run_id": run, "step_slug": "s", "task_index": 0}, "x", **{key: value})
    with raises_sqlstate("22023", rf"^fail_tasks\(\): element 0: {problem}; nothing was applied"):
        rt.rows("SELECT * FROM pgflow.fail_tasks(%s)", (Jsonb([bad]),))
    assert fingerprint(db.conninfo).differences(before) == []


def test_fail_tasks_applies_plain_delayed_fail_now_and_exhausted_elements_in_one_call(rt):
    rt.flow("mixed", [{"slug": "s"}], max_attempts=2, base_delay=1)
    spent = rt.start("mixed", {"n": 4})
    [first] = rt.poll("mixed")
    rt.fail(spent, "s", 0, "first try")
    rt.make_visible("mixed")
    rt.poll("mixed")  # its last attempt
    plain, delayed, now = (rt.start("mixed", {"n": n}) for n in range(3))
    claimed = {t["run_id"]: t for t in rt.poll("mixed")}
    claimed[spent] = first

    rows = rt.rows("SELECT * FROM pgflow.fail_tasks(%s)", (Jsonb([
        _element(claimed[plain], "plain"),
        _element(claimed[delayed], "delayed", retry_delay_seconds=45, fail_now=None),
        _element(claimed[now], "now", retry_delay_seconds=None, fail_now=True),
        _element(claimed[spent], "spent", retry_delay_seconds=45),
    ]),))
    assert [(r["run_id"], r["status"], r["attempts_count"], r["requested_retry_delay"], r["failed_now"]) for r in rows] == [
        (plain, "queued", 1, None, False), (delayed, "queued", 1, 45, False),
        (now, "failed", 1, None, True), (spent, "failed", 2, 45, False)]
    assert rt.vt_in("mixed", claimed[plain]["msg_id"]) == pytest.approx(2, abs=TOLERANCE)  # the backoff
    assert rt.vt_in("mixed", claimed[delayed]["msg_id"]) == pytest.approx(45, abs=TOLERANCE)
    assert {r: rt.run(r)["status"] for r in (plain, delayed, now, spent)} == {
        plain: "started", delayed: "started", now: "failed", spent: "failed"}
    assert {m["msg_id"] for m in rt.archived("mixed")} == {claimed[now]["msg_id"], claimed[spent]["msg_id"]}


def test_every_released_call_form_keeps_working_and_none_is_ambiguous(rt):
    rt.flow("forms", [{"slug": "s"}], max_attempts=9, base_delay=1)
    run = rt.start("forms", {})
    calls = [
        ("SELECT * FROM pgflow.fail_task(%s, 's', 0, 'positional')", 2),
        ("SELECT * FROM pgflow.fail_task(run_id => %s, step_slug => 's', task_index => 0, error_message => 'named')", 4),
        ("SELECT * FROM pgflow.fail_task(%s, 's', 0, 'five arguments', 7)", 7),
        ("SELECT * FROM pgflow.fail_task(%s, 's', 0, 'typed', 9::integer, false)", 9),
        ("SELECT * FROM pgflow.fail_tasks(jsonb_build_array(jsonb_build_object('run_id', %s::text, 'step_slug', 's', "
         "'task_index', 0, 'error_message', 'element without directive keys')))", 32),
    ]
    [task] = rt.poll("forms")
    for statement, visible_in in calls:
        row = rt.one(statement, (run,))
        assert row["status"] == "queued", statement
        assert rt.vt_in("forms", task["msg_id"]) == pytest.approx(visible_in, abs=TOLERANCE), statement
        rt.make_visible("forms")
        rt.poll("forms")


def test_a_fail_now_waiting_behind_a_claim_of_the_same_task_ends_the_running_attempt(rt, db):
    """The task's message became visible while its handler still runs (a long handler) and another
    worker claims it: the claim holds the run, the handler's fail-now waits for it, the claim finds
    the task started and takes nothing, then the fail-now ends the running attempt."""
    rt.flow("raced", [{"slug": "s"}], max_attempts=5, base_delay=0)
    run = rt.start("raced", {})
    [task] = rt.poll("raced")
    rt.make_visible("raced")

    claimer, reporter = db.connect(), db.connect()
    claimer.autocommit = False
    ids = [r[0] for r in claimer.execute("SELECT msg_id FROM pgmq.read(%s, 30, 10)", (rt.queue("raced"),))]
    assert ids == [task["msg_id"]]
    outcomes = rt.claim_outcomes("raced", ids, conn=claimer)  # uncommitted: it holds the run row
    assert [o["outcome"] for o in outcomes] == ["duplicate"]

    result = commit_when_blocked(rt.conn, claimer, reporter, lambda: reporter.execute(
        DIRECTED, (run, "s", 0, "gone", None, True)).fetchone())
    assert "error" not in result, result
    row = rt.task(run, "s")
    assert (row["status"], row["attempts_count"], row["failed_now"]) == ("failed", 1, True)
    assert rt.run(run)["status"] == "failed" and rt.messages("raced") == []
    for conn in (claimer, reporter):
        conn.close()


def test_a_claim_waiting_behind_a_delayed_retry_takes_the_message_it_read_before(rt, db):
    """The other order: a worker read the task's message (its visibility had run out) just before the
    handler's retry delay is recorded. Its claim waits for the report, then finds the task queued and
    takes it: a delay defers the message, it cannot take back a read that already happened (the same
    holds for the step's backoff). No deadlock, and attempts are counted once each."""
    rt.flow("raced2", [{"slug": "s"}], max_attempts=5, base_delay=0)
    run = rt.start("raced2", {})
    [task] = rt.poll("raced2")
    rt.make_visible("raced2")
    claimer = db.connect()
    ids = [r[0] for r in claimer.execute("SELECT msg_id FROM pgmq.read(%s, 30, 10)", (rt.queue("raced2"),))]
    assert ids == [task["msg_id"]]

    reporter = db.connect()
    reporter.autocommit = False
    assert reporter.execute(DIRECTED, (run, "s", 0, "later", 120, False)).fetchone() is not None
    result = commit_when_blocked(rt.conn, reporter, claimer,
                                 lambda: rt.claim_outcomes("raced2", ids, conn=claimer))
    assert "error" not in result, result
    assert [o["outcome"] for o in result["value"]] == ["claimed"]
    row = rt.task(run, "s")
    assert (row["status"], row["attempts_count"], row["requested_retry_delay"]) == ("started", 2, 120)
    for conn in (claimer, reporter):
        conn.close()


def test_the_released_form_and_the_new_one_are_granted_together(db):
    """Nothing of it reaches PUBLIC (permissions: tests/permissions/test_batch_grants.py)."""
    with db.connect() as conn:
        assert conn.execute("SELECT has_function_privilege('public', "
                            "'pgflow.fail_task(uuid, text, integer, text, double precision, boolean)', 'EXECUTE')").fetchone()[0] is False




def test_a_batch_delay_beyond_double_precision_is_infinite_and_one_below_it_is_zero(rt, db):
    """JSON numbers have no range: 1e400 is refused as infinite, 1e-400 retries at once."""
    rt.flow("extremes", [{"slug": "s"}], max_attempts=3, base_delay=60)
    run = rt.start("extremes", {})
    [task] = rt.poll("extremes")
    element = '[{"run_id": "%s", "step_slug": "s", "task_index": 0, "error_message": "x", "retry_delay_seconds": %s}]'
    before = fingerprint(db.conninfo)
    with raises_sqlstate("PF013", r"^fail_tasks\(\): element 0: fail_task\(\): .*not Infinity"):
        rt.rows("SELECT * FROM pgflow.fail_tasks(%s::jsonb)", (element % (run, "1e400"),))
    assert fingerprint(db.conninfo).differences(before) == []
    [row] = rt.rows("SELECT * FROM pgflow.fail_tasks(%s::jsonb)", (element % (run, "1e-400"),))
    assert (row["status"], row["requested_retry_delay"]) == ("queued", 0)
    assert rt.vt_in("extremes", task["msg_id"]) <= 0.5  # the backoff would say 120 s

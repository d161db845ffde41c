"""Decision-table rows that end in ``fatal``: ambiguous identity or origin.

For every case the same promises hold (tests.claim.helpers.assert_fatal, checked from a second
connection after the call returned without raising): nothing claimed, no task row changed,
nothing archived, the whole batch visible again, the worker's function paused with a reason
naming queue, message ids and reason codes (never a body), the worker deprecated, one WARNING.

Each batch also holds a perfectly valid queued task, which stays queued with no attempt used.
"""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from tests.claim.helpers import ClaimEnv, assert_fatal, assert_no_body

SECRET = "body-secret-" + uuid.uuid4().hex


@pytest.fixture
def alpha(cl: ClaimEnv):
    """Flows alpha (a, m: root map) and beta (b); one run of each; a registered alpha worker."""
    cl.flow("alpha", [{"slug": "a"}, {"slug": "m", "step_type": "map"}])
    cl.flow("beta", [{"slug": "b"}])
    run = cl.start("alpha", [1, 2])
    beta_run = cl.start("beta", {})
    worker = cl.worker("alpha")
    return {"run": run, "beta_run": beta_run, "worker": worker}


def _body(flow, run_id, step="a", index=0, **extra):
    return json.dumps({"flow_slug": flow, "run_id": str(run_id), "step_slug": step, "task_index": index, **extra})


def _fatal_case(cl, alpha, *, extra_ids, fatal, queue="alpha", flow="alpha", step=None, worker=None,
                secrets=(SECRET,)):
    """Read the whole alpha queue (valid tasks + the crafted messages), claim, check the fatal path."""
    worker = worker or alpha["worker"]
    batch = cl.read(queue)
    assert set(extra_ids) <= set(batch)
    before = cl.snapshot()
    function = cl.worker_row(worker)["function_name"]
    result = cl.claim(queue, batch, worker, flow, step)
    assert_fatal(cl, result, before=before, queue=queue, batch=batch, fatal=fatal, worker_id=worker,
                 function=function, secrets=list(secrets))
    return result


# ----------------------------------------------------------------------------------------------
# no task has the message's identity, but the body looks like pgflow work
# ----------------------------------------------------------------------------------------------
def test_pgflow_shaped_body_without_a_task_is_fatal_task_missing(cl, alpha):
    ghost_run = uuid.uuid4()
    msg = cl.send("alpha", _body("alpha", ghost_run, note=SECRET))
    _fatal_case(cl, alpha, extra_ids=[msg], fatal={msg: "task_missing"}, secrets=(SECRET, str(ghost_run)))
    # the valid tasks of the batch were not claimed
    assert {t["status"] for t in cl.tasks(alpha["run"])} == {"queued"}


@pytest.mark.parametrize("other_flow", ["beta", "ghostFlow"])
def test_pgflow_shaped_body_for_another_flow_is_fatal(cl, alpha, other_flow):
    msg = cl.send("alpha", _body(other_flow, alpha["beta_run"], step="b", note=SECRET))
    _fatal_case(cl, alpha, extra_ids=[msg], fatal={msg: "work_for_another_flow"})
    assert cl.task(alpha["beta_run"], "b")["status"] == "queued"


@pytest.mark.parametrize("body", [
    {"flow_slug": "alpha", "note": SECRET},
    {"run_id": "RUN", "note": SECRET},
    {"step_slug": "a", "task_index": 0, "note": SECRET},
    {"flow_slug": "alpha", "run_id": "RUN", "step_slug": "a", "note": SECRET},
    {"task_index": 0},
], ids=["flow-only", "run-only", "step-and-index", "three-of-four", "index-only"])
def test_a_body_with_only_some_pgflow_keys_is_fatal_ambiguous(cl, alpha, body):
    body = {k: (str(alpha["run"]) if v == "RUN" else v) for k, v in body.items()}
    msg = cl.send("alpha", body)
    _fatal_case(cl, alpha, extra_ids=[msg], fatal={msg: "ambiguous_message"})


# ----------------------------------------------------------------------------------------------
# a task has the message's identity, but the body names something else
# ----------------------------------------------------------------------------------------------
MISMATCHED_BODIES = {
    "foreign-object": '{"hello": "world", "note": "%s"}' % SECRET,
    "array": '["%s"]' % SECRET,
    "string": '"%s"' % SECRET,
    "number": "7",
    "json-null": "null",
    "sql-null": None,
    "missing-task-index": '{"flow_slug": "alpha", "run_id": "RUN", "step_slug": "a", "note": "%s"}' % SECRET,
    "missing-flow-slug": '{"run_id": "RUN", "step_slug": "a", "task_index": 0}',
    "index-as-string": '{"flow_slug": "alpha", "run_id": "RUN", "step_slug": "a", "task_index": "0"}',
    "other-index": '{"flow_slug": "alpha", "run_id": "RUN", "step_slug": "a", "task_index": 1}',
    "other-run": '{"flow_slug": "alpha", "run_id": "%s", "step_slug": "a", "task_index": 0}' % uuid.uuid4(),
    "upper-case-run-id": '{"flow_slug": "alpha", "run_id": "UPPER", "step_slug": "a", "task_index": 0}',
}


@pytest.mark.parametrize("kind", list(MISMATCHED_BODIES))
def test_a_task_whose_message_body_does_not_match_it_is_fatal(cl, alpha, kind):
    """The message's identity belongs to queued task a[0], its body does not describe a[0]:
    neither claimed nor archived as foreign (a body never causes an existing task's message to be
    archived). Crafted by repointing the task's message_id to the new message."""
    run = alpha["run"]
    body = MISMATCHED_BODIES[kind]
    if body is None:
        msg = cl.val("SELECT * FROM pgmq.send('alpha', NULL::jsonb)")
    else:
        msg = cl.send("alpha", body.replace("RUN", str(run)).replace("UPPER", str(run).upper()))
    original = cl.task(run, "a")["message_id"]
    cl.conn.execute("UPDATE pgflow.step_tasks SET message_id = %s WHERE run_id = %s AND step_slug = 'a'", (msg, run))
    # the task's original message is now pgflow work without a task: fatal as well
    _fatal_case(cl, alpha, extra_ids=[msg, original],
                fatal={msg: "message_does_not_match_task", original: "task_missing"})
    # repair the crafted damage so the run is whole again
    cl.conn.execute("UPDATE pgflow.step_tasks SET message_id = %s WHERE run_id = %s AND step_slug = 'a'",
                    (original, run))


def test_two_tasks_with_swapped_messages_are_both_fatal(cl, alpha):
    run = alpha["run"]
    m0, m1 = cl.task(run, "m", 0)["message_id"], cl.task(run, "m", 1)["message_id"]
    with cl.conn.transaction():
        cl.conn.execute("UPDATE pgflow.step_tasks SET message_id = -message_id WHERE run_id = %s AND step_slug = 'm'",
                        (run,))
        cl.conn.execute("UPDATE pgflow.step_tasks SET message_id = CASE task_index WHEN 0 THEN %s ELSE %s END "
                        "WHERE run_id = %s AND step_slug = 'm'", (m1, m0, run))
    _fatal_case(cl, alpha, extra_ids=[m0, m1],
                fatal={m0: "message_does_not_match_task", m1: "message_does_not_match_task"})
    with cl.conn.transaction():
        cl.conn.execute("UPDATE pgflow.step_tasks SET message_id = -message_id WHERE run_id = %s AND step_slug = 'm'",
                        (run,))
        cl.conn.execute("UPDATE pgflow.step_tasks SET message_id = CASE task_index WHEN 0 THEN %s ELSE %s END "
                        "WHERE run_id = %s AND step_slug = 'm'", (m0, m1, run))


def test_a_task_of_another_step_route_is_fatal(cl, alpha):
    """A step worker (its route: flow alpha, step a) meets a task of step m in its queue.
    Schema 0003 has no private step queues, so the step-queued flow is simulated by switching
    alpha's queue mode; both steps' persisted route is then the queue alpha."""
    cl.conn.execute("UPDATE pgflow.flows SET queue_mode = 'step' WHERE flow_slug = 'alpha'")
    step_worker = cl.worker("alpha", function="alpha-a-worker", step="a")
    run = alpha["run"]
    m_ids = [cl.task(run, "m", i)["message_id"] for i in (0, 1)]
    _fatal_case(cl, alpha, extra_ids=m_ids, fatal={m: "task_on_another_route" for m in m_ids}, step="a",
                worker=step_worker)
    assert cl.function_row("alpha-worker")["enabled"] is True  # only the claiming function is paused
    cl.conn.execute("UPDATE pgflow.flows SET queue_mode = 'flow' WHERE flow_slug = 'alpha'")


def test_a_task_of_another_flow_in_this_queue_is_fatal(cl, alpha):
    """Task b[0] of flow beta carries the identity (alpha, msg) and a matching body: the worker of
    alpha must not run beta's work. Crafted with triggers off (queue_name is immutable)."""
    beta_run = alpha["beta_run"]
    msg = cl.send("alpha", _body("beta", beta_run, step="b"))
    original = cl.task(beta_run, "b")["message_id"]
    with cl.conn.transaction():
        cl.conn.execute("SET LOCAL session_replication_role = replica")
        cl.conn.execute("UPDATE pgflow.step_tasks SET queue_name = 'alpha', message_id = %s WHERE run_id = %s",
                        (msg, beta_run))
    _fatal_case(cl, alpha, extra_ids=[msg], fatal={msg: "task_on_another_route"})
    with cl.conn.transaction():
        cl.conn.execute("SET LOCAL session_replication_role = replica")
        cl.conn.execute("UPDATE pgflow.step_tasks SET queue_name = 'beta', message_id = %s WHERE run_id = %s",
                        (original, beta_run))


def test_a_queued_task_that_cannot_run_is_fatal(cl, alpha):
    """A queued task under a run that is no longer started (inconsistent data, crafted): the
    message is preserved, not claimed and not archived."""
    run = alpha["run"]
    cl.conn.execute("UPDATE pgflow.runs SET status = 'failed', failed_at = now() WHERE run_id = %s", (run,))
    ids = [t["message_id"] for t in cl.tasks(run)]
    _fatal_case(cl, alpha, extra_ids=ids, fatal={m: "task_not_claimable" for m in ids})
    cl.conn.execute("UPDATE pgflow.runs SET status = 'started', failed_at = NULL WHERE run_id = %s", (run,))


# ----------------------------------------------------------------------------------------------
# the worker's route itself is wrong: every message of the batch is fatal
# ----------------------------------------------------------------------------------------------
def test_unknown_flow_is_fatal(cl, alpha):
    ids = [t["message_id"] for t in cl.tasks(alpha["run"])]
    _fatal_case(cl, alpha, extra_ids=ids, flow="ghostFlow", fatal={m: "unknown_flow" for m in ids})


def test_unknown_flow_from_a_worker_registered_without_a_flow_is_fatal(cl, alpha):
    anonymous = cl.worker(None, function="anonymous-fn", queue="alpha")
    ids = [t["message_id"] for t in cl.tasks(alpha["run"])]
    _fatal_case(cl, alpha, extra_ids=ids, flow="ghostFlow", worker=anonymous, fatal={m: "unknown_flow" for m in ids})


def test_a_step_selector_on_a_plain_flow_is_fatal(cl, alpha):
    ids = [t["message_id"] for t in cl.tasks(alpha["run"])]
    _fatal_case(cl, alpha, extra_ids=ids, step="a", fatal={m: "step_selector_on_plain_flow" for m in ids})


def test_a_worker_of_alpha_claiming_from_the_queue_of_beta_is_fatal(cl, alpha):
    ids = [t["message_id"] for t in cl.tasks(alpha["beta_run"])]
    _fatal_case(cl, alpha, queue="beta", extra_ids=ids, fatal={m: "queue_not_owned_by_route" for m in ids})
    assert cl.task(alpha["beta_run"], "b")["status"] == "queued"
    assert cl.function_row("beta-worker") is None  # beta's workers are not affected


def test_a_worker_of_alpha_claiming_as_beta_is_refused_and_pauses_nobody(cl, alpha):
    """The registered route decides: a worker registered for alpha may not claim beta's work even
    when it names beta and beta's queue in the call. Schema 0004: the call is refused (PF007)
    without pausing alpha's function, because the caller may be a stale process under a reused id
    (tests/claim/test_live_safety.py)."""
    batch = cl.read("beta")
    before = cl.snapshot()
    with pytest.raises(psycopg.Error) as refused:
        cl.claim("beta", batch, alpha["worker"], "beta")
    assert refused.value.sqlstate == "PF007" and "registered for flow \"alpha\"" in str(refused.value)
    assert cl.snapshot(cl.connect()) == before
    assert cl.task(alpha["beta_run"], "b")["status"] == "queued"
    assert cl.function_row("alpha-worker")["enabled"] is True


def test_a_queue_no_flow_owns_is_fatal(cl, alpha):
    cl.conn.execute("SELECT pgmq.create('app_jobs')")
    ids = [cl.send("app_jobs", {"job": n, "note": SECRET}) for n in range(3)]
    ids.append(cl.send("app_jobs", _body("alpha", alpha["run"])))
    _fatal_case(cl, alpha, queue="app_jobs", extra_ids=ids, fatal={m: "queue_not_owned_by_route" for m in ids})
    # an application's queue is never archived by pgflow
    assert cl.archived("app_jobs") == []


def test_a_queue_that_does_not_exist_is_fatal_not_an_error(cl, alpha):
    before = cl.snapshot()
    result = cl.claim("no_such_queue", [1, 2], alpha["worker"], "alpha")
    assert_fatal(cl, result, before=before, queue="no_such_queue", batch=[1, 2],
                 fatal={1: "queue_not_owned_by_route", 2: "queue_not_owned_by_route"},
                 worker_id=alpha["worker"], function="alpha-worker")


# ----------------------------------------------------------------------------------------------
# an unregistered worker: an error (retryable by registering), nothing changed
# ----------------------------------------------------------------------------------------------
def test_an_unregistered_worker_gets_pf007_and_nothing_changes(cl, alpha):
    cl.send("alpha", {"hello": "world"})
    batch = cl.read("alpha")
    before = cl.snapshot()
    functions = cl.rows("SELECT * FROM pgflow.worker_functions ORDER BY function_name")
    with pytest.raises(psycopg.Error) as caught:
        cl.claim("alpha", batch, uuid.uuid4(), "alpha")
    assert caught.value.sqlstate == "PF007"
    assert "not registered" in str(caught.value)
    assert cl.snapshot(cl.connect()) == before
    assert cl.rows("SELECT * FROM pgflow.worker_functions ORDER BY function_name") == functions
    # the batch is still invisible (the read's visibility), nothing was archived or released
    assert set(cl.visible_now("alpha", batch).values()) == {False}


# ----------------------------------------------------------------------------------------------
# after a fatal stop
# ----------------------------------------------------------------------------------------------
def test_after_a_fatal_stop_the_function_is_fenced_until_enabled_again(cl, alpha):
    msg = cl.send("alpha", _body("alpha", uuid.uuid4(), note=SECRET))
    batch = cl.read("alpha")
    result = cl.claim("alpha", batch, alpha["worker"], "alpha")
    assert result.ids("fatal") == [msg]

    # a restarted worker of the same function is refused at registration
    with pytest.raises(psycopg.Error) as caught:
        cl.worker("alpha")
    assert caught.value.sqlstate == "PF001"
    assert_no_body([str(caught.value)], [SECRET])
    # the worker that met the fatal batch learns at its next heartbeat that it is deprecated
    assert cl.val("SELECT pgflow.send_heartbeat(%s)", (alpha["worker"],)) is True
    # workers of other functions are not affected
    cl.worker("alpha", function="other-fn")

    # the operator inspects the preserved message by queue and id, then removes it ...
    kept = cl.one("SELECT msg_id, read_ct, vt <= clock_timestamp() AS visible FROM pgmq.q_alpha WHERE msg_id = %s",
                  (msg,))
    assert kept == {"msg_id": msg, "read_ct": 1, "visible": True}
    cl.conn.execute("SELECT pgmq.archive('alpha', %s::bigint)", (msg,))
    # ... and resumes the function: the pause reason is cleared
    cl.conn.execute("UPDATE pgflow.worker_functions SET enabled = true WHERE function_name = 'alpha-worker'")
    fn = cl.function_row("alpha-worker")
    assert (fn["enabled"], fn["paused_at"], fn["paused_reason"]) == (True, None, None)
    worker = cl.worker("alpha")
    result = cl.claim("alpha", cl.read("alpha"), worker, "alpha")
    assert len(result.claimed) == 3 and result.warnings() == []


def test_fatal_stops_of_two_workers_of_one_function_keep_both_reasons(cl, alpha):
    """Two workers of alpha-worker run; each meets different unsupported work. The pause keeps
    its first time and names every preserved message, so one inspection covers both stops."""
    second_worker = cl.worker("alpha")
    first = cl.send("alpha", _body("alpha", uuid.uuid4()))
    cl.claim("alpha", cl.read("alpha"), alpha["worker"], "alpha")
    paused = cl.function_row("alpha-worker")
    assert f"message {first} task_missing" in paused["paused_reason"]

    second = cl.send("alpha", {"flow_slug": "alpha"})
    result = cl.claim("alpha", [second], second_worker, "alpha")  # the other worker's batch
    assert result.outcomes == {second: ("fatal", "ambiguous_message")}
    fn = cl.function_row("alpha-worker")
    assert fn["enabled"] is False
    assert fn["paused_at"] == paused["paused_at"]
    assert f"message {first} task_missing" in fn["paused_reason"]
    assert f"message {second} ambiguous_message" in fn["paused_reason"]
    assert f"worker {second_worker}" in fn["paused_reason"]


def test_a_fatal_claim_of_a_fenced_function_records_its_reason(cl, alpha):
    """A rollout fence disabled the function while its worker still ran: the fatal claim adds
    its reason; enabling the function clears it."""
    cl.conn.execute("UPDATE pgflow.worker_functions SET enabled = false WHERE function_name = 'alpha-worker'")
    bad = cl.send("alpha", _body("beta", uuid.uuid4(), step="b"))
    cl.claim("alpha", cl.read("alpha"), alpha["worker"], "alpha")
    fn = cl.function_row("alpha-worker")
    assert fn["enabled"] is False and f"message {bad} work_for_another_flow" in fn["paused_reason"]
    assert fn["paused_at"] is not None
    cl.conn.execute("UPDATE pgflow.worker_functions SET enabled = true WHERE function_name = 'alpha-worker'")
    assert cl.function_row("alpha-worker")["paused_reason"] is None

"""Step workers on real queues: each polls exactly one queue and claims only its (flow, step); a
database with plain and step-queued flows side by side; and the Stage 1 paths on tasks spread over
several private queues (failure cancellation, stalled recovery, pruning, deletion)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_cli import sqlfiles
from pgflow_cli.worker import Flow, WorkerOptions, step_worker, with_step_queues
from tests.support.invariants import assert_runtime_invariants
from tests.worker.conftest import env  # noqa: F401  (the fixture: a WorkerEnv, invariants checked after)
from tests.worker.helpers import FAST, Recorder, WorkerEnv


def diamond(recorder: Recorder, slug: str) -> Flow:
    return (
        Flow(slug, base_delay=0)
        .step("root", recorder.wrap(lambda value, ctx: value["n"]))
        .step("left", recorder.wrap(lambda deps, ctx: deps["root"] + 1), depends_on=["root"])
        .step("right", recorder.wrap(lambda deps, ctx: deps["root"] * 2), depends_on=["root"])
        .step("join", recorder.wrap(lambda deps, ctx: deps["left"] + deps["right"]), depends_on=["left", "right"])
    )


def start_step_workers(env: WorkerEnv, queued, **options):
    workers = []
    for step in queued.step_slugs:
        worker = step_worker(queued, step, env.conninfo, function_name=f"{queued.slug}-{step}",
                             options=WorkerOptions(application_name="pgflow-worker-test", **{**FAST, **options}))
        env.workers.append(worker)
        worker.start()
        workers.append(worker)
    return workers


def test_each_step_worker_polls_one_queue_and_claims_only_its_step(env):
    queued = with_step_queues(diamond(env.recorder, "stepDiamond"))
    workers = start_step_workers(env, queued)
    runs = env.start_runs("stepDiamond", [{"n": n} for n in range(12)])
    env.wait_runs_finished(runs)
    assert {env.run(r)["status"] for r in runs} == {"completed"}
    outputs = {str(r["run_id"]): r["output"] for r in env.rows("SELECT run_id, output FROM pgflow.runs")}
    assert outputs[runs[5]] == {"join": (5 + 1) + (5 * 2)}
    by_worker = {w.worker_id: w.step_slug for w in workers}
    for call in env.recorder.calls:  # every handler ran in the worker of its own step
        assert by_worker[call.worker_id] == call.step_slug
    tasks = env.rows("SELECT step_slug, queue_name, last_worker_id::text AS worker FROM pgflow.step_tasks")
    assert all(t["queue_name"] == queued.routes[t["step_slug"]] for t in tasks)
    assert all(by_worker[t["worker"]] == t["step_slug"] for t in tasks)
    rows = env.rows("SELECT step_slug, queue_name FROM pgflow.workers ORDER BY step_slug")
    assert [(r["step_slug"], r["queue_name"]) for r in rows] == sorted((s, q) for s, q in queued.routes.items())


def test_a_step_workers_claim_refuses_another_steps_queue(env):
    queued = with_step_queues(diamond(env.recorder, "selector"))
    worker = step_worker(queued, "left", env.conninfo, function_name="selector-left", options=WorkerOptions(**FAST))
    env.workers.append(worker)
    worker.start()
    worker.stop("test")
    worker.join(60)
    run_id = env.start_run("selector", {"n": 1})
    msg = env.task(run_id, "root")["message_id"]
    # the worker registered for "left" hands over a message of the "root" queue
    rows = env.rows("SELECT outcome, reason FROM pgflow.claim_tasks('selector__root', %s, %s, 'selector', 'left')",
                    ([msg], worker.worker_id))
    assert [(r["outcome"], r["reason"]) for r in rows] == [("fatal", "queue_not_owned_by_route")]
    assert env.task(run_id, "root")["status"] == "queued"
    env.require_live_messages = True


def test_a_database_with_plain_and_step_queued_flows(env):
    plain = diamond(env.recorder, "mixedPlain")
    queued = with_step_queues(diamond(env.recorder, "mixedSteps"))
    plain_worker = env.start_worker(plain)
    start_step_workers(env, queued)
    plain_runs = env.start_runs("mixedPlain", [{"n": n} for n in range(8)])
    step_runs = env.start_runs("mixedSteps", [{"n": n} for n in range(8)])
    env.wait_runs_finished(plain_runs + step_runs)
    queues = {r["flow_slug"]: r["queues"] for r in env.rows(
        "SELECT flow_slug, array_agg(DISTINCT queue_name ORDER BY queue_name) AS queues FROM pgflow.step_tasks GROUP BY 1")}
    assert queues["mixedPlain"] == ["mixedplain"]
    assert queues["mixedSteps"] == sorted(queued.routes.values())
    plain_ids = {c.worker_id for c in env.recorder.calls if c.run_id in plain_runs}
    assert plain_ids == {plain_worker.worker_id}
    env.conn.execute("UPDATE pgflow.workers SET deprecated_at = now()")  # stopping below drains them


# -------------------------------------------------------------------------------------------------
# Stage 1 paths over several queues (no workers: the test drives the SQL directly)
# -------------------------------------------------------------------------------------------------

def three_roots(slug: str) -> Flow:
    def noop(value, ctx):
        return value

    return Flow(slug, max_attempts=1, base_delay=0).step("a", noop).step("b", noop).step("c", noop)


def compile_queued(conn, flow: Flow):
    queued = with_step_queues(flow)
    conn.execute(
        "SELECT pgflow.ensure_flow_compiled(%s, %s, protocol_version => 2, queue_mode => 'step', route_map => %s)",
        (flow.slug, Jsonb(flow.shape()), Jsonb(queued.route_map())))
    return queued


def register(conn, queued, step: str) -> str:
    return str(conn.execute(
        "SELECT w FROM gen_random_uuid() AS w, pgflow.register_worker(w, 'fn', %s, %s, %s)",
        (queued.routes[step], queued.slug, step)).fetchone()[0])


def claim(conn, queued, step: str, worker: str) -> list[tuple]:
    queue = queued.routes[step]
    ids = [r[0] for r in conn.execute("SELECT msg_id FROM pgmq.read(%s, 30, 100)", (queue,)).fetchall()]
    return conn.execute("SELECT outcome, step_slug, task_index, run_id FROM pgflow.claim_tasks(%s, %s, %s, %s, %s)",
                        (queue, ids, worker, queued.slug, step)).fetchall()


def live_and_archived(conn, queue: str) -> tuple[int, int]:
    table = conn.execute("SELECT pgmq.format_table_name(%s, 'q'), pgmq.format_table_name(%s, 'a')", (queue, queue)).fetchone()
    return tuple(conn.execute(f'SELECT (SELECT count(*) FROM pgmq."{table[0]}"), (SELECT count(*) FROM pgmq."{table[1]}")').fetchone())


def test_a_failed_run_cancels_and_archives_siblings_in_every_queue(db):
    conn = db.connect()
    queued = compile_queued(conn, three_roots("failSpread"))
    run_id = conn.execute("SELECT run_id FROM pgflow.start_flow('failSpread', '{}')").fetchone()[0]
    worker_a, worker_b = register(conn, queued, "a"), register(conn, queued, "b")
    assert [r[0] for r in claim(conn, queued, "b", worker_b)] == ["claimed"]  # b started, c queued
    assert [r[0] for r in claim(conn, queued, "a", worker_a)] == ["claimed"]
    conn.execute("SELECT pgflow.fail_task(%s, 'a', 0, 'boom')", (run_id,))
    assert conn.execute("SELECT status FROM pgflow.runs WHERE run_id = %s", (run_id,)).fetchone()[0] == "failed"
    statuses = dict(conn.execute("SELECT step_slug, status FROM pgflow.step_tasks WHERE run_id = %s", (run_id,)).fetchall())
    assert statuses == {"a": "failed", "b": "cancelled", "c": "cancelled"}
    for step in "abc":  # every queue, not only the first: no live message left, each archived in its own queue
        assert live_and_archived(conn, queued.routes[step]) == (0, 1), step
    assert_runtime_invariants(db.connect(), require_live_messages=True)


def test_stalled_recovery_requeues_tasks_of_several_queues(db):
    conn = db.connect()
    queued = compile_queued(conn, three_roots("stallSpread"))
    conn.execute("SELECT pgflow.start_flow('stallSpread', '{}')")
    for step in "ab":
        claim(conn, queued, step, register(conn, queued, step))
    conn.execute("UPDATE pgflow.step_tasks SET queued_at = queued_at - interval '2 hours',"
                 " started_at = started_at - interval '2 hours' WHERE status = 'started'")
    conn.execute("SELECT pgflow.requeue_stalled_tasks()")
    assert conn.execute("SELECT array_agg(status ORDER BY step_slug) FROM pgflow.step_tasks").fetchone()[0] == \
        ["queued", "queued", "queued"]
    for step in "ab":  # both messages visible again in their own queues
        visible = conn.execute("SELECT count(*) FROM pgmq.read(%s, 30, 10)", (queued.routes[step],)).fetchone()[0]
        assert visible == 1, step
    assert_runtime_invariants(db.connect(), require_live_messages=True)


def test_pruning_clears_the_archives_of_every_step_queue(db):
    conn = db.connect()
    conn.execute(sqlfiles.load("optional/prune.sql"))
    queued = compile_queued(conn, three_roots("pruneSpread"))
    run_id = conn.execute("SELECT run_id FROM pgflow.start_flow('pruneSpread', '{}')").fetchone()[0]
    for step in "abc":
        claim(conn, queued, step, register(conn, queued, step))
        conn.execute("SELECT pgflow.complete_task(%s, %s, 0, '1')", (run_id, step))
    assert conn.execute("SELECT status FROM pgflow.runs WHERE run_id = %s", (run_id,)).fetchone()[0] == "completed"
    assert [live_and_archived(conn, queued.routes[s]) for s in "abc"] == [(0, 1)] * 3
    conn.execute("UPDATE pgflow.runs SET started_at = started_at - interval '100 days', "
                 "completed_at = completed_at - interval '100 days'")
    for queue in queued.routes.values():
        table = conn.execute("SELECT pgmq.format_table_name(%s, 'a')", (queue,)).fetchone()[0]
        conn.execute(f'UPDATE pgmq."{table}" SET archived_at = archived_at - interval \'100 days\'')
    conn.execute("SELECT pgflow.prune_data_older_than(interval '30 days')")
    assert conn.execute("SELECT count(*) FROM pgflow.runs").fetchone()[0] == 0
    assert [live_and_archived(conn, queued.routes[s]) for s in "abc"] == [(0, 0)] * 3


def test_deleting_a_step_queued_flow_drops_every_private_queue(db):
    conn = db.connect()
    queued = compile_queued(conn, three_roots("dropSpread"))
    keep = compile_queued(conn, three_roots("keepMe"))
    conn.execute("SELECT pgflow.start_flow('dropSpread', '{}')")
    claim(conn, queued, "a", register(conn, queued, "a"))
    conn.execute("SELECT pgflow.delete_flow_and_data('dropSpread')")
    queues = [r[0] for r in conn.execute("SELECT queue_name::text FROM pgmq.meta ORDER BY 1").fetchall()]
    assert queues == sorted(keep.routes.values())
    tables = conn.execute("SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                          "WHERE n.nspname = 'pgmq' AND c.relname LIKE '%%dropspread%%'").fetchone()[0]
    assert tables == 0
    assert conn.execute("SELECT count(*) FROM pgflow.step_tasks").fetchone()[0] == 0


def test_registration_names_the_route_of_a_step_queued_flow(db):
    conn = db.connect()
    queued = compile_queued(conn, three_roots("regRoute"))
    with pytest.raises(psycopg.Error) as caught:
        conn.execute("SELECT pgflow.register_worker(gen_random_uuid(), 'fn', %s, 'regRoute', 'b')", (queued.routes["a"],))
    assert caught.value.sqlstate == "PF004" and "route" in str(caught.value)


def test_a_skipped_step_archives_its_siblings_in_its_own_queue_only(db):
    conn = db.connect()

    def noop(value, ctx):
        return value

    flow = Flow("skipSpread", max_attempts=1).map("m", noop, when_exhausted="skip").step("b", noop)
    queued = compile_queued(conn, flow)
    run_id = conn.execute("SELECT run_id FROM pgflow.start_flow('skipSpread', '[1, 2, 3]')").fetchone()[0]
    worker = register(conn, queued, "m")
    queue = queued.routes["m"]
    ids = [r[0] for r in conn.execute("SELECT msg_id FROM pgmq.read(%s, 30, 1)", (queue,)).fetchall()]
    [(outcome, index)] = conn.execute("SELECT outcome, task_index FROM pgflow.claim_tasks(%s, %s, %s, 'skipSpread', 'm')",
                                      (queue, ids, worker)).fetchall()
    assert outcome == "claimed"
    conn.execute("SELECT pgflow.fail_task(%s, 'm', %s, 'boom')", (run_id, index))
    assert conn.execute("SELECT status FROM pgflow.step_states WHERE run_id = %s AND step_slug = 'm'",
                        (run_id,)).fetchone()[0] == "skipped"
    assert live_and_archived(conn, queue) == (0, 3)  # the failed task and both siblings, in m's queue
    assert live_and_archived(conn, queued.routes["b"]) == (1, 0)  # b's message untouched in its queue
    assert_runtime_invariants(db.connect(), require_live_messages=True)

"""Worker lifecycle on the real server: graceful stop, deprecation, SIGTERM drain in a
subprocess, a SIGKILLed worker recovered by stalled-task recovery, and startup refusals
(fenced function, shape mismatch, protocol mismatch) that register nothing and read nothing.
"""

from __future__ import annotations

import signal
import threading
import uuid

import pytest

from pgflow_cli.worker import Flow, FlowShapeMismatch, ProtocolMismatch, WorkerFenced
from pgflow_cli.worker.protocol import LATEST
from tests.worker.flows import PROC_FLOW, proc_flow
from tests.worker.helpers import wait_until

QUIET_WINDOW = 1.5
"""Seconds a stopped/draining worker is given to (wrongly) pick up new work before we look."""


def blocking_flow(slug: str, rec, release: threading.Event) -> Flow:
    def hold(run_input, ctx):
        assert release.wait(120), "the test never released the handler"
        return {"held": run_input}

    return (
        Flow(slug, base_delay=0)
        .step("hold", rec.wrap(hold))
        .step("then", rec.wrap(lambda deps, ctx: deps["hold"]), depends_on=["hold"])
    )


def _quiet(seconds: float) -> None:
    threading.Event().wait(seconds)


def _assert_untouched(env, run_id: str, queue: str, step: str) -> None:
    """The run's task was never claimed by anyone."""
    task = env.task(run_id, step)
    assert (task["status"], task["attempts_count"], task["last_worker_id"]) == ("queued", 0, None)
    assert env.message(queue, task["message_id"]) is not None


# ----------------------------------------------------------------------------------------------
# stop() and deprecation
# ----------------------------------------------------------------------------------------------
def test_stop_while_a_handler_runs_finishes_the_task_and_marks_the_worker_stopped(env):
    rec = env.recorder
    release = threading.Event()
    flow = blocking_flow("stopFlow", rec, release)
    worker = env.start_worker(flow)
    run_id = env.start_run("stopFlow", {"k": 1})
    wait_until(lambda: rec.for_step("hold"), "the handler to start")
    assert env.task(run_id, "hold")["status"] == "started"

    worker.stop()
    wait_until(lambda: worker.state == "draining", "the worker to stop polling and drain")
    later = env.start_run("stopFlow", {"k": 2})  # arrives while draining: must not be picked up
    _quiet(QUIET_WINDOW)
    assert not worker.join(0), "the worker stopped before its in-flight handler finished"
    release.set()
    assert worker.join(60)

    task = env.task(run_id, "hold")
    assert (task["status"], task["attempts_count"], task["output"]) == ("completed", 1, {"held": {"k": 1}})
    row = env.worker_row(worker.worker_id)
    assert row["stopped_at"] is not None and row["stopped_at"] >= task["completed_at"]
    assert worker.state == "stopped" and worker.stop_reason == "stop requested"
    # nothing after the stop: the released child step and the later run wait for another worker
    assert env.task(run_id, "then")["status"] == "queued"
    _assert_untouched(env, later, worker.queue_name, "hold")
    assert [c.run_id for c in rec.calls] == [run_id]

    # a fresh worker finishes what the stopped one left
    fresh = env.start_worker(blocking_flow("stopFlow", rec, release))
    env.wait_runs_finished([run_id, later])
    assert env.run(run_id)["status"] == env.run(later)["status"] == "completed"
    assert str(env.task(later, "hold")["last_worker_id"]) == fresh.worker_id


def test_deprecated_worker_stops_polling_and_drains(env):
    rec = env.recorder
    release = threading.Event()
    worker = env.start_worker(blocking_flow("deprecFlow", rec, release))
    run_id = env.start_run("deprecFlow", {"k": 1})
    wait_until(lambda: rec.for_step("hold"), "the handler to start")

    env.conn.execute("UPDATE pgflow.workers SET deprecated_at = now() WHERE worker_id = %s", (worker.worker_id,))
    wait_until(lambda: worker.stop_reason == "deprecated", "the heartbeat to report the deprecation")
    wait_until(lambda: worker.state == "draining", "the worker to stop polling")
    later = env.start_run("deprecFlow", {"k": 2})
    _quiet(QUIET_WINDOW)
    assert not worker.join(0), "the deprecated worker abandoned its in-flight handler"
    release.set()
    assert worker.join(60)

    task = env.task(run_id, "hold")
    assert (task["status"], task["attempts_count"]) == ("completed", 1)
    row = env.worker_row(worker.worker_id)
    assert row["deprecated_at"] is not None and row["stopped_at"] is not None
    _assert_untouched(env, later, worker.queue_name, "hold")
    assert env.task(run_id, "then")["status"] == "queued"
    env.start_worker(blocking_flow("deprecFlow", rec, release))
    env.wait_runs_finished([run_id, later])


# ----------------------------------------------------------------------------------------------
# worker subprocesses: SIGTERM drains, SIGKILL is recovered by stalled recovery
# ----------------------------------------------------------------------------------------------
def _wait_registered(env, worker_id: str, proc) -> None:
    def registered():
        if proc.popen.poll() is not None:
            raise AssertionError(f"worker process exited early ({proc.popen.returncode}):\n" + "\n".join(proc.lines("stderr")))
        return env.worker_row(worker_id) is not None

    wait_until(registered, "the worker process to register", describe=lambda: "\n".join(proc.lines("stderr")[-20:]))


def test_sigterm_drains_the_in_flight_task_before_the_process_exits(env, tmp_path):
    release = tmp_path / "release"
    worker_id = str(uuid.uuid4())
    proc = env.spawn(function_name="proc-worker", worker_id=worker_id, release_file=release)
    _wait_registered(env, worker_id, proc)
    run_id = env.start_run(PROC_FLOW, {"job": 1})
    proc.wait_for_line(f"STARTED {run_id}")
    assert env.task(run_id, "work")["status"] == "started"

    proc.signal(signal.SIGTERM)
    proc.wait_for_line("received SIGTERM", which="stderr")
    later = env.start_run(PROC_FLOW, {"job": 2})
    _quiet(QUIET_WINDOW)
    assert proc.popen.poll() is None, "the process exited with a handler still running"
    release.touch()
    assert proc.wait(60) == 0
    assert any(line.startswith("EXIT 0 signal SIGTERM") for line in proc.lines())

    work = env.task(run_id, "work")
    assert (work["status"], work["attempts_count"]) == ("completed", 1)
    assert work["output"] == {"by": "process", "pid": proc.popen.pid}
    row = env.worker_row(worker_id)
    assert row["stopped_at"] is not None and row["stopped_at"] >= work["completed_at"]
    # after SIGTERM the process claimed nothing: the released child step and the later run are untouched
    assert env.task(run_id, "after")["status"] == "queued"
    later_task = env.task(later, "work")
    assert (later_task["status"], later_task["attempts_count"]) == ("queued", 0)

    fresh = env.start_worker(proc_flow(env.recorder.wrap(lambda v, ctx: {"by": "fresh"}),
                                       env.recorder.wrap(lambda d, ctx: d)))
    env.wait_runs_finished([run_id, later])
    assert str(env.task(later, "work")["last_worker_id"]) == fresh.worker_id
    assert [c.run_id for c in env.recorder.for_step("work")] == [later]


def test_killed_worker_task_is_recovered_by_stalled_recovery_and_completed_once(env, tmp_path):
    release = tmp_path / "release-never"
    worker_id = str(uuid.uuid4())
    proc = env.spawn(function_name="proc-worker", worker_id=worker_id, release_file=release)
    _wait_registered(env, worker_id, proc)
    run_id = env.start_run(PROC_FLOW, {"job": "kill"})
    proc.wait_for_line(f"STARTED {run_id}")
    claimed = env.task(run_id, "work")
    assert (claimed["status"], claimed["attempts_count"], str(claimed["last_worker_id"])) == ("started", 1, worker_id)

    proc.kill()  # SIGKILL while the handler runs: no report, no stopped_at
    assert proc.popen.returncode == -signal.SIGKILL
    assert env.worker_row(worker_id)["stopped_at"] is None
    assert env.task(run_id, "work")["status"] == "started"

    # not stalled yet: the claim is younger than timeout (1 s) + 30 s
    assert env.val("SELECT pgflow.requeue_stalled_tasks()") == 0
    # instead of waiting 31 s, move the claim into the past
    env.conn.execute(
        "UPDATE pgflow.step_tasks SET started_at = started_at - interval '40 seconds', "
        "queued_at = queued_at - interval '40 seconds' WHERE run_id = %s AND step_slug = 'work'", (run_id,))
    assert env.val("SELECT pgflow.requeue_stalled_tasks()") == 1
    requeued = env.task(run_id, "work")
    assert (requeued["status"], requeued["attempts_count"], requeued["requeued_count"]) == ("queued", 1, 1)

    rec = env.recorder
    fresh = env.start_worker(proc_flow(rec.wrap(lambda v, ctx: {"by": "fresh", "input": v}), rec.wrap(lambda d, ctx: d)))
    [run] = env.wait_runs_finished([run_id])

    assert run["status"] == "completed"
    work = env.task(run_id, "work")
    assert (work["status"], work["attempts_count"], work["requeued_count"]) == ("completed", 2, 1)
    assert work["output"] == {"by": "fresh", "input": {"job": "kill"}}
    assert str(work["last_worker_id"]) == fresh.worker_id
    assert [(c.run_id, c.worker_id) for c in rec.for_step("work")] == [(run_id, fresh.worker_id)]
    assert [line for line in proc.lines() if line.startswith("FINISHED")] == []  # the killed handler never finished
    # one message, kept across the requeue, archived exactly once at the completion
    assert work["message_id"] == claimed["message_id"]
    assert len(env.archived_messages(fresh.queue_name, work["message_id"])) == 1
    assert env.run(run_id)["output"] == {"after": {"work": {"by": "fresh", "input": {"job": "kill"}}}}


# ----------------------------------------------------------------------------------------------
# startup refusals: nothing registered, nothing read
# ----------------------------------------------------------------------------------------------
def _prepare_flow_with_a_queued_run(env, flow: Flow) -> tuple[str, str, dict]:
    """Compile ``flow`` with a worker of another function, stop it, then start a run."""
    setup = env.start_worker(flow, function_name="setup-worker")
    env.stop_workers([setup])
    run_id = env.start_run(flow.slug, {"x": 1})
    [task] = env.tasks(run_id)
    return run_id, setup.queue_name, task


def _assert_nothing_registered_or_read(env, worker, function_name: str, queue: str, task: dict) -> None:
    assert worker.state == "stopped"
    assert worker.stats.snapshot()["polls"] == 0
    assert env.val("SELECT count(*) FROM pgflow.workers WHERE function_name = %s", (function_name,)) == 0
    assert env.worker_row(worker.worker_id) is None
    message = env.message(queue, task["message_id"])
    assert message is not None and message["read_ct"] == 0
    after = env.task(str(task["run_id"]), task["step_slug"])
    assert (after["status"], after["attempts_count"]) == ("queued", 0)


def test_fenced_function_refuses_to_start(env):
    flow = Flow("fencedFlow").step("only", env.recorder.wrap(lambda v, ctx: v))
    run_id, queue, task = _prepare_flow_with_a_queued_run(env, flow)
    env.conn.execute("SELECT pgflow.track_worker_function('fenced-fn')")
    env.conn.execute("UPDATE pgflow.worker_functions SET enabled = false WHERE function_name = 'fenced-fn'")

    worker = env.worker(flow, function_name="fenced-fn")
    with pytest.raises(WorkerFenced, match="fenced-fn"):
        worker.start()
    _assert_nothing_registered_or_read(env, worker, "fenced-fn", queue, task)
    assert env.val("SELECT enabled FROM pgflow.worker_functions WHERE function_name = 'fenced-fn'") is False
    assert env.recorder.calls == []
    with pytest.raises(RuntimeError):
        worker.start()  # a refused worker cannot be started again

    # lifting the fence lets a new worker of the function run the waiting task
    env.conn.execute("UPDATE pgflow.worker_functions SET enabled = true WHERE function_name = 'fenced-fn'")
    env.start_worker(flow, function_name="fenced-fn")
    assert env.wait_runs_finished([run_id])[0]["status"] == "completed"


def test_shape_mismatch_refuses_to_start(env):
    original = Flow("shapeFlow").step("a", env.recorder.wrap(lambda v, ctx: v))
    run_id, queue, task = _prepare_flow_with_a_queued_run(env, original)
    changed = (
        Flow("shapeFlow")
        .step("a", env.recorder.wrap(lambda v, ctx: v))
        .step("b", env.recorder.wrap(lambda d, ctx: d), depends_on=["a"])
    )
    assert env.val("SELECT pgflow.is_local()") is False

    worker = env.worker(changed, function_name="shape-fn")
    with pytest.raises(FlowShapeMismatch, match="shapeFlow") as caught:
        worker.start()
    assert caught.value.detail, "the refusal names the differences"
    _assert_nothing_registered_or_read(env, worker, "shape-fn", queue, task)
    assert env.val("SELECT count(*) FROM pgflow.steps WHERE flow_slug = 'shapeFlow'") == 1  # definition unchanged
    assert env.recorder.calls == []
    env.start_worker(original, function_name="shape-fn")
    assert env.wait_runs_finished([run_id])[0]["status"] == "completed"


def test_protocol_mismatch_refuses_to_start(env):
    class FutureProtocol(LATEST):
        version = LATEST.version + 1

    flow = Flow("protoFlow").step("a", env.recorder.wrap(lambda v, ctx: v))
    run_id, queue, task = _prepare_flow_with_a_queued_run(env, flow)
    worker = env.worker(flow, function_name="proto-fn", protocol=FutureProtocol())
    with pytest.raises(ProtocolMismatch, match=f"protocol {LATEST.version + 1}.*protocol {LATEST.version}"):
        worker.start()
    _assert_nothing_registered_or_read(env, worker, "proto-fn", queue, task)
    env.start_worker(flow, function_name="proto-fn")
    assert env.wait_runs_finished([run_id])[0]["status"] == "completed"


def test_a_fenced_worker_refuses_before_compiling_its_flow(env):
    """A supervisor restarting an old worker during a fence must not (re)create its flow."""
    env.conn.execute("SELECT pgflow.track_worker_function('gone-fn')")
    env.conn.execute("UPDATE pgflow.worker_functions SET enabled = false WHERE function_name = 'gone-fn'")
    worker = env.worker(Flow("goneFlow").step("only", lambda v, ctx: v), function_name="gone-fn")
    with pytest.raises(WorkerFenced):
        worker.start()
    assert env.val("SELECT count(*) FROM pgflow.flows WHERE flow_slug = 'goneFlow'") == 0
    assert env.val("SELECT count(*) FROM pgmq.meta WHERE queue_name = 'goneflow'") == 0


def test_a_worker_that_cannot_connect_ends_stopped_instead_of_hanging(env):
    from pgflow_cli.errors import ConnectionFailed
    from pgflow_cli.worker import Worker, WorkerOptions

    worker = Worker(Flow("nowhereFlow").step("only", lambda v, ctx: v),
                    "host=127.0.0.1 port=1 dbname=none", function_name="nowhere-fn",
                    options=WorkerOptions(connect_timeout=2))
    with pytest.raises(ConnectionFailed) as refused:  # through db.connect: mapped and redacted like the CLI's
        worker.start()
    assert refused.value.exit_code == 3 and "worker nowhere-fn" in refused.value.message
    assert worker.state == "stopped" and worker.join(1)


def test_a_stale_process_under_a_reused_worker_id_stops_and_leaves_the_new_owner_alone(env):
    """Schema 0004: the id of a pruned alpha worker is registered again for beta; the alpha process
    that still runs under it is refused (heartbeat and claim) and stops, and beta's function and
    worker row are left exactly as beta's worker set them."""

    alpha = Flow("staleAlpha").step("only", env.recorder.wrap(lambda v, ctx: v))
    beta = Flow("staleBeta").step("only", lambda v, ctx: v)
    stale = env.start_worker(alpha, heartbeat_interval=0.2)
    env.start_worker(beta).stop("only compiles and registers beta")
    env.conn.execute("DELETE FROM pgflow.workers WHERE worker_id = %s", (stale.worker_id,))
    env.conn.execute("SELECT pgflow.register_worker(%s, 'staleBeta-worker', 'stalebeta', 'staleBeta')",
                     (stale.worker_id,))
    env.start_run("staleAlpha", {})
    assert stale.join(60), "the stale process kept running under an id that belongs to beta now"
    assert stale.fatal and "no longer belongs to this process" in stale.fatal
    assert env.recorder.for_step("only") == []  # no handler ran for the stale process
    row = env.conn.execute("SELECT flow_slug, stopped_at, deprecated_at FROM pgflow.workers WHERE worker_id = %s",
                           (stale.worker_id,)).fetchone()
    assert (row["flow_slug"], row["stopped_at"], row["deprecated_at"]) == ("staleBeta", None, None)
    assert env.val("SELECT enabled FROM pgflow.worker_functions WHERE function_name = 'staleBeta-worker'") is True

"""The worker's Prometheus endpoint, scraped over HTTP during real runs on a real database.

Every counter is checked against the rows the database holds afterwards (attempts, completed and
failed tasks), never against numbers written into the test; states (running, draining, paused)
are waited for by scraping until they show.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import uuid

import pytest

from pgflow_cli import db as pgdb
from pgflow_cli.operations import exporter as exporter_op
from pgflow_cli.worker import Flow, MetricsUnavailable, RetryLater
from tests.observability.scrape import Scrape, get, scrape, scrape_until
from tests.worker.helpers import REPO, wait_until

SECRET = "in-put-7d1f0c"
"""A value every run input and output carries; it must never appear in a scrape."""

TASK_LABELS = {"flow", "step", "queue", "outcome", "kind", "operation", "sqlstate_class", "state", "le"}
"""Every label name the worker's metrics may carry: bounded values only."""


def mixed_flow(slug: str, gate: threading.Event) -> Flow:
    """One step whose behaviour the run input picks: ok, retry (RetryLater once), flaky (fails once),
    fail (fails every attempt: final on the last), block (waits for ``gate``)."""

    def work(run_input, ctx):
        mode = run_input["mode"]
        if mode == "retry" and ctx.attempt == 1:
            raise RetryLater(0, "rate limited")
        if mode == "flaky" and ctx.attempt == 1:
            raise ValueError("flaky once")
        if mode == "fail":
            raise ValueError("always fails")
        if mode == "block":
            gate.wait(60)
        return {"echo": run_input["secret"]}

    return Flow(slug, max_attempts=2, base_delay=0).step("work", work)


def start_runs(env, slug: str, modes: list[str]) -> list[str]:
    return env.start_runs(slug, [{"mode": mode, "secret": SECRET} for mode in modes])


def task_rows(env, run_ids: list[str]) -> dict[str, int]:
    return env.one(
        "SELECT coalesce(sum(attempts_count), 0)::int AS attempts, "
        "count(*) FILTER (WHERE status = 'completed')::int AS completed, "
        "count(*) FILTER (WHERE status = 'failed')::int AS failed "
        "FROM pgflow.step_tasks WHERE run_id = ANY(%s::uuid[])", (run_ids,))


def test_counters_match_the_database_rows(env):
    gate = threading.Event()
    flow = mixed_flow("obsmix", gate)
    worker = env.start_worker(flow, metrics_port=0, max_concurrent=4, batch_size=4)
    address = worker.metrics_address
    assert address is not None and address[1] > 0
    modes = ["ok"] * 5 + ["retry"] * 2 + ["flaky"] * 2 + ["fail"] * 2
    run_ids = start_runs(env, "obsmix", modes)
    env.wait_runs_finished(run_ids)
    rows = task_rows(env, run_ids)
    labels = {"flow": "obsmix", "step": "work", "queue": worker.queue_name}

    def settled(s: Scrape) -> bool:  # reports are counted once the database call returned
        return (s.value("pgflow_worker_tasks_completed_total", **labels) == rows["completed"]
                and s.value("pgflow_worker_tasks_failed_total", **labels, outcome="final") == rows["failed"])

    s = scrape_until(address, settled, "the completions and final failures of every run")
    assert rows["failed"] == 2 and rows["completed"] == 9  # the flow did what the test meant
    assert s.value("pgflow_worker_tasks_claimed_total", **labels) == rows["attempts"]
    retried = rows["attempts"] - rows["completed"] - rows["failed"]
    assert s.value("pgflow_worker_tasks_failed_total", **labels, outcome="retry") == retried
    retry_later = env.val("SELECT count(*) FROM pgflow.step_tasks t JOIN pgflow.runs r USING (run_id) "
                          "WHERE t.run_id = ANY(%s::uuid[]) AND r.input->>'mode' = 'retry' AND t.attempts_count > 1",
                          (run_ids,))
    assert s.value("pgflow_worker_tasks_retry_later_total", **labels) == retry_later
    # every attempt ran its handler once, and every reported attempt travelled in exactly one report call
    assert s.value("pgflow_worker_handler_duration_seconds_count", **labels) == rows["attempts"]
    assert s.value("pgflow_worker_report_batch_size_sum") == rows["attempts"]
    route = {"flow": "obsmix", "step": "", "queue": worker.queue_name}  # the worker's own series: its route
    polls = s.value("pgflow_worker_polls_total", **route)
    assert polls >= 1 and 0 <= s.value("pgflow_worker_empty_polls_total", **route) <= polls
    assert s.value("pgflow_worker_state", **route, state="running") == 1
    assert s.value("pgflow_worker_state", **route, state="draining") == 0
    assert s.value("pgflow_worker_slots", **route) == 4
    assert s.has("pgflow_worker_heartbeat_age_seconds", **route)
    assert get(address, "/healthz")[0] == 200
    # bounded labels only, and nothing of the runs' inputs or outputs
    assert {name for sample in s.samples for name in sample.labels} <= TASK_LABELS
    for run_id in run_ids:
        assert run_id not in s.text
    assert SECRET not in s.text
    # nor in the exporter's, though inputs, outputs and error texts hold it now
    assert env.val("SELECT count(*) FROM pgflow.runs WHERE run_id = ANY(%s::uuid[]) AND output::text LIKE %s",
                   (run_ids, f"%{SECRET}%")) == rows["completed"]
    target = pgdb.Target(env.conninfo, "test")
    exporter = exporter_op.Exporter(lambda: pgdb.connect(target), host="127.0.0.1", port=0)
    try:
        exported = scrape(exporter.address)
    finally:
        exporter.close()
    assert exported.value("pgflow_exporter_up") == 1
    assert exported.value("pgflow_flow_runs", flow="obsmix", state="completed") == rows["completed"]
    assert exported.value("pgflow_flow_runs", flow="obsmix", state="failed") == rows["failed"]
    assert SECRET not in exported.text and "always fails" not in exported.text
    for run_id in run_ids:
        assert run_id not in exported.text

    # drain: a blocked handler keeps the worker draining; the endpoint says so and /healthz turns 503
    blocked = start_runs(env, "obsmix", ["block"])
    scrape_until(address, lambda s: s.value("pgflow_worker_tasks_in_flight", **route) == 1, "the blocked task")
    worker.stop("test drain")
    s = scrape_until(address, lambda s: s.value("pgflow_worker_state", **route, state="draining") == 1, "draining")
    assert s.value("pgflow_worker_state", **route, state="running") == 0
    status, body = get(address, "/healthz")
    assert status == 503 and "draining" in body
    gate.set()
    assert worker.join(60)
    env.wait_runs_finished(blocked)
    with pytest.raises(OSError):  # a stopped worker stops serving
        socket.create_connection(address, timeout=5).close()


def test_a_fatal_claim_shows_as_paused(env):
    gate = threading.Event()
    flow = mixed_flow("obsfatal", gate)
    worker = env.start_worker(flow, metrics_port=0, max_concurrent=2, batch_size=2)
    route = {"flow": "obsfatal", "step": "", "queue": worker.queue_name}
    start_runs(env, "obsfatal", ["block"])
    scrape_until(worker.metrics_address, lambda s: s.value("pgflow_worker_tasks_in_flight", **route) == 1,
                 "the blocked task")
    # a message naming a task of this flow that does not exist: the claim's fatal outcome (task_missing)
    env.val("SELECT pgmq.send(%s, %s::jsonb)", (worker.queue_name, json.dumps(
        {"flow_slug": "obsfatal", "run_id": str(uuid.uuid4()), "step_slug": "work", "task_index": 0})))
    s = scrape_until(worker.metrics_address, lambda s: s.value("pgflow_worker_state", **route, state="paused") == 1,
                     "the paused state")
    assert s.value("pgflow_worker_state", **route, state="running") == 0
    assert get(worker.metrics_address, "/healthz")[0] == 503
    paused = env.val("SELECT paused_reason FROM pgflow.worker_functions WHERE function_name = %s",
                     (worker.function_name,))
    assert paused and "task_missing" in paused
    gate.set()
    assert worker.join(60)
    assert worker.paused and worker.fatal
    env.require_live_messages = False  # the fatal message stays in the queue for the operator


def test_workers_in_one_process_have_their_own_series(env):
    gate = threading.Event()
    gate.set()
    first = env.start_worker(mixed_flow("obsone", gate), metrics_port=0)
    second = env.start_worker(mixed_flow("obstwo", gate), metrics_port=0)
    assert first.metrics_address != second.metrics_address
    env.wait_runs_finished(start_runs(env, "obsone", ["ok"] * 3) + start_runs(env, "obstwo", ["ok"]))
    one = scrape_until(first.metrics_address, lambda s: s.value("pgflow_worker_tasks_completed_total") == 3, "3")
    two = scrape_until(second.metrics_address, lambda s: s.value("pgflow_worker_tasks_completed_total") == 1, "1")
    assert one.label_values("pgflow_worker_tasks_completed_total", "flow") == {"obsone"}
    assert two.label_values("pgflow_worker_tasks_completed_total", "flow") == {"obstwo"}


def test_a_port_in_use_refuses_before_registering(env):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        worker = env.worker(mixed_flow("obsport", threading.Event()), metrics_port=taken.getsockname()[1])
        with pytest.raises(MetricsUnavailable, match="cannot serve metrics"):
            worker.start()
    finally:
        taken.close()
    assert worker.state == "stopped"
    assert env.val("SELECT count(*) FROM pgflow.workers WHERE worker_id = %s", (worker.worker_id,)) == 0


SCRIPT = """
import sys
from pgflow_cli.worker import Flow, Worker, WorkerOptions
worker = Worker(Flow("obsoff").step("work", lambda value, ctx: value), sys.argv[1], function_name="obsoff-worker",
                options=WorkerOptions(max_poll_seconds=1, heartbeat_interval=0.3))
worker.start()
worker.stop("done")
assert worker.join(60)
print("prometheus_client" in sys.modules, worker.metrics_address)
"""


def test_without_a_port_nothing_of_prometheus_client_is_imported(env):
    done = subprocess.run([sys.executable, "-c", SCRIPT, env.conninfo], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "None"]
    wait_until(lambda: env.val("SELECT stopped_at IS NOT NULL FROM pgflow.workers WHERE function_name = "
                               "'obsoff-worker'"), "the worker row's stop")


FLOWS = """
from pgflow_cli.worker import Flow

hello = Flow("obscli").step("greet", lambda value, ctx: {"hi": value["secret"]})
"""


def test_the_worker_command_serves_metrics_on_the_port_it_logs(env, tmp_path):
    flows = tmp_path / "obs_flows.py"
    flows.write_text(FLOWS)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgflow_cli", "worker", f"{flows}:hello", "--metrics-port", "0",
         "--heartbeat-interval", "0.3", "--dsn", env.conninfo],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(line.rstrip() for line in proc.stderr), daemon=True).start()
    try:
        found = wait_until(lambda: next((m for m in (re.search(r"metrics on http://([0-9.]+):([0-9]+)/metrics", line)
                                                      for line in list(lines)) if m), None),
                           "the logged metrics address", describe=lambda: "\n".join(lines))
        address = (found.group(1), int(found.group(2)))
        route = {"flow": "obscli", "step": "", "queue": "obscli"}
        scrape_until(address, lambda s: s.value("pgflow_worker_state", **route, state="running") == 1, "running")
        run_ids = env.start_runs("obscli", [{"secret": SECRET}] * 3)
        env.wait_runs_finished(run_ids)
        s = scrape_until(address, lambda s: s.value("pgflow_worker_tasks_completed_total") == 3, "3 completions")
        assert SECRET not in s.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)

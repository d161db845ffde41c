"""``pgflow exporter`` as a real process (and the library class in process), scraped over HTTP.

Values are compared with the database's own rows at the moment of the check; route states are
waited for by scraping until they show, never by sleeping.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from pgflow_cli import db as pgdb
from pgflow_cli.operations import exporter as exporter_op
from pgflow_cli.worker import Flow
from tests.observability.scrape import get, scrape, scrape_until
from tests.support.cli import run_cli
from tests.worker.flows import PROC_FLOW
from tests.worker.helpers import REPO, wait_until

SECRET = "ex-secret-5b2e91"
"""A value in every run input here; it must never appear in a scrape."""


def read_only_role(admin: psycopg.Connection, *, fences: bool = True) -> str:
    """A LOGIN role with the grants docs/observability.md gives the exporter (without the fence
    function's EXECUTE when ``fences`` is False)."""
    role = f"exp_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE ROLE "{role}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE')
    admin.execute(f'GRANT USAGE ON SCHEMA pgflow, pgmq TO "{role}"')
    admin.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA pgflow, pgmq TO "{role}"')
    if fences:
        admin.execute(f'GRANT EXECUTE ON FUNCTION pgflow._fence_holds(pgflow.fences, pgflow.worker_functions) '
                      f'TO "{role}"')
    return role


def drop_role(admin: psycopg.Connection, role: str) -> None:
    admin.execute(f'DROP OWNED BY "{role}"')
    admin.execute(f'DROP ROLE "{role}"')


class ExporterProcess:
    """``python -m pgflow_cli exporter --listen 127.0.0.1:0 ...`` with its stderr collected."""

    def __init__(self, conninfo: str, *extra: str) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
        env.pop("PGFLOW_DATABASE_URL", None)
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "pgflow_cli", "exporter", "--listen", "127.0.0.1:0", "--dsn", conninfo, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO))
        self.lines: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            self.lines.append(line.rstrip("\n"))

    def address(self) -> tuple[str, int]:
        def bound():
            for line in list(self.lines):
                found = re.search(r"metrics on http://([0-9.]+):([0-9]+)/metrics", line)
                if found:
                    return found.group(1), int(found.group(2))
            assert self.popen.poll() is None, "exporter exited:\n" + "\n".join(self.lines)
            return None

        return wait_until(bound, "the exporter's address", describe=lambda: "\n".join(self.lines))

    def stop(self, signum: int = signal.SIGTERM) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signum)
        return self.popen.wait(timeout=60)


def queue_messages(env, queue: str) -> int:
    table = env.val("SELECT pgmq.format_table_name(%s, 'q')", (queue,))
    return env.val(sql.SQL("SELECT count(*) FROM pgmq.{}").format(sql.Identifier(table)))


def test_a_killed_workers_route_shows_not_covered_with_its_backlog(env, tmp_path: Path):
    admin = env.db.connect()
    worker_id = str(uuid.uuid4())
    proc = env.spawn(function_name="exp-proc-worker", worker_id=worker_id, release_file=tmp_path / "never")
    wait_until(lambda: env.worker_row(worker_id), "the worker process to register (its flow compiled)")
    run_ids = env.start_runs(PROC_FLOW, [{"n": i, "secret": SECRET} for i in range(4)])
    proc.wait_for_line("STARTED")
    role = read_only_role(admin)
    exporter = ExporterProcess(f"{env.conninfo} user={role}", "--cache-seconds", "0", "--heartbeat-window", "1")
    try:
        address = exporter.address()
        queue = PROC_FLOW.lower()
        route = {"flow": PROC_FLOW, "step": "", "queue": queue}
        scrape_until(address, lambda s: s.value("pgflow_route_state", **route, state="covered") == 1, "covered")
        assert get(address, "/healthz")[0] == 200
        proc.kill()  # SIGKILL: no drain, no stop mark, the row keeps its last heartbeat
        s = scrape_until(address, lambda s: s.value("pgflow_route_state", **route, state="covered") == 0,
                         "the route to lose its worker")
        assert s.value("pgflow_route_state", **route, state="stale") == 1
        assert s.value("pgflow_route_work_waiting", **route) == 1
        assert s.value("pgflow_route_workers", **route, state="stale") == 1
        assert s.value("pgflow_route_workers", **route, state="live") == 0
        # nothing moves any more: the numbers are the database's
        assert s.value("pgflow_route_backlog_messages", **route) == queue_messages(env, queue) > 0
        for state in ("started", "completed", "failed"):
            expected = env.val("SELECT count(*) FROM pgflow.runs WHERE flow_slug = %s AND status = %s",
                               (PROC_FLOW, state))
            assert s.value("pgflow_flow_runs", flow=PROC_FLOW, state=state) == expected
        assert s.value("pgflow_flow_runs", flow=PROC_FLOW, state="started") == len(run_ids)
        assert s.value("pgflow_flow_tasks", flow=PROC_FLOW, state="queued") == env.val(
            "SELECT count(*) FROM pgflow.step_tasks WHERE flow_slug = %s AND status = 'queued'", (PROC_FLOW,))
        assert s.value("pgflow_flow_workers", flow=PROC_FLOW, state="stale") == 1
        # its started tasks, once past their timeout + 30 s (moved back rather than waited for), are stalled
        moved = env.val("WITH m AS (UPDATE pgflow.step_tasks SET queued_at = queued_at - interval '60 seconds', "
                        "started_at = started_at - interval '60 seconds' "
                        "WHERE flow_slug = %s AND status = 'started' RETURNING 1) SELECT count(*) FROM m", (PROC_FLOW,))
        assert moved > 0
        s = scrape_until(address, lambda s: s.value("pgflow_route_stalled_tasks", **route) == moved, "stalled tasks")
        assert s.value("pgflow_flow_stalled_tasks", flow=PROC_FLOW) == moved
        assert s.value("pgflow_route_given_up_tasks", **route) == env.val(
            "SELECT count(*) FROM pgflow.step_tasks WHERE flow_slug = %s AND permanently_stalled_at IS NOT NULL",
            (PROC_FLOW,))
        level = env.val("SELECT max(version) FROM pgflow.schema_migrations WHERE state = 'applied'")
        assert s.value("pgflow_migration_level") == level
        assert s.value("pgflow_migration_in_progress") == 0
        assert s.value("pgflow_fences_active") == 0
        # no input, output or id of a run reaches a scrape
        assert SECRET not in s.text
        for run_id in run_ids:
            assert run_id not in s.text
        assert exporter.stop(signal.SIGTERM) == 0
    finally:
        exporter.stop(signal.SIGKILL)
        drop_role(admin, role)


def test_the_exporter_refuses_a_superuser(db):
    superuser = run_cli("exporter", "--listen", "127.0.0.1:0", "--dsn", db.conninfo)
    assert superuser.code == 2, superuser.output
    assert "--allow-write-role" in superuser.output and "can write" in superuser.output


@pytest.mark.parametrize(("fences", "grant", "code", "said"), [
    (True, 'GRANT INSERT ON pgflow.runs TO "{role}"', 2, "table pgflow.runs"),  # can write one table
    (False, None, 3, "GRANT EXECUTE ON FUNCTION pgflow._fence_holds"),  # cannot read the fence record
])
def test_the_exporter_refuses_a_role_it_should_not_run_as(db, fences, grant, code, said):
    admin = db.connect()
    role = read_only_role(admin, fences=fences)
    try:
        if grant:
            admin.execute(grant.format(role=role))
        result = run_cli("exporter", "--listen", "127.0.0.1:0", "--dsn", f"{db.conninfo} user={role}")
        assert result.code == code, result.output
        assert said in result.output
    finally:
        drop_role(admin, role)


def test_a_bad_listen_address_is_a_usage_error(db):
    result = run_cli("exporter", "--listen", "localhost", "--dsn", db.conninfo, "--allow-write-role")
    assert result.code == 2 and "HOST:PORT" in result.output


def test_concurrent_scrapes_share_one_read(db):
    target = pgdb.Target(db.conninfo, "test")
    served = exporter_op.Exporter(lambda: pgdb.connect(target, application_name="pgflow-exporter-test"),
                                  host="127.0.0.1", port=0, cache_seconds=3600)
    admin, watcher = db.connect(), db.connect()  # pg_stat_activity stays as it was inside one transaction
    try:
        # hold the first read back with a lock on a table it reads, while the other scrapes arrive
        results: list[float] = []
        with admin.transaction():
            admin.execute("LOCK TABLE pgflow.flows IN ACCESS EXCLUSIVE MODE")
            threads = [threading.Thread(target=lambda: results.append(scrape(served.address).value(
                "pgflow_exporter_refreshes_total"))) for _ in range(6)]
            for thread in threads:
                thread.start()
            wait_until(lambda: watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'").fetchone()[0] == 1, "the exporter's read to wait for the lock",
                timeout=4)  # the read's lock_timeout is 5 s
        for thread in threads:
            thread.join(60)
        assert results == [1.0] * len(threads)  # one read served every scrape
        assert scrape(served.address).value("pgflow_exporter_refreshes_total") == 1  # and the next, from the cache
    finally:
        served.close()


def test_a_fence_and_its_drain(env):
    gate = threading.Event()

    def work(value, ctx):
        gate.wait(60)
        return value

    worker = env.start_worker(Flow("obsfence").step("work", work), function_name="obsfence-worker")
    run_ids = env.start_runs("obsfence", [{"n": 1}])
    wait_until(lambda: env.val("SELECT count(*) FROM pgflow.step_tasks WHERE flow_slug = 'obsfence' "
                               "AND status = 'started'") == 1, "the task to start")
    target = pgdb.Target(env.conninfo, "test")
    served = exporter_op.Exporter(lambda: pgdb.connect(target), host="127.0.0.1", port=0, cache_seconds=0)
    function = {"function": "obsfence-worker"}
    try:
        assert scrape(served.address).value("pgflow_fences_active") == 0
        env.val("SELECT count(*) FROM pgflow.fence_disable(ARRAY['obsfence-worker'], 'test rollout')")
        s = scrape_until(served.address, lambda s: s.value("pgflow_fences_active") == 1, "the fence")
        assert s.has("pgflow_fence_age_seconds", **function)
        assert s.value("pgflow_fence_function_enabled", **function) == 0
        # the deprecated worker drains: it still heartbeats and holds its started task
        started = env.val("SELECT count(*) FROM pgflow.step_tasks WHERE last_worker_id = %s AND status = 'started'",
                          (worker.worker_id,))
        assert started == 1
        assert s.value("pgflow_fence_live_workers", **function) == 1
        assert s.value("pgflow_fence_tasks_in_flight", **function) == started
        assert s.value("pgflow_fence_tasks_stranded", **function) == 0
        gate.set()
        env.wait_runs_finished(run_ids)
        assert worker.join(60)
        s = scrape_until(served.address, lambda s: s.value("pgflow_fence_live_workers", **function) == 0, "the drain")
        assert s.value("pgflow_fence_tasks_in_flight", **function) == 0
        assert s.value("pgflow_fences_active") == 1  # drained, not restored
    finally:
        gate.set()
        served.close()

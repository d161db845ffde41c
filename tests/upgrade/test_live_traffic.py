"""The migration under live traffic: producers, workers and maintenance never deadlock with it.

Several real connections run through the whole of ``migrate apply``: producers call
``start_flow`` in a loop, workers read, claim and complete (protocol 1 until the upgrade
commits, then protocol 2, as the runbook's new workers do), and a maintenance connection calls
``requeue_stalled_tasks`` and the optional ``prune_data_older_than``. Every producer call must
succeed (waiting is fine), nobody may see SQLSTATE 40P01 (deadlock), the migrator must not need
a deadlock retry either, and every run started must finish afterwards.

Known and separate (tests/upgrade/test_stale_row_type.py, docs/upgrade.md): a ``complete_task``
waiting for the migration's lock in a session that cached ``step_tasks``' row type fails with
42804 "wrong record type supplied in RETURN NEXT" when a migration adding a column to the table
commits; the call was rolled back and the same call again works. The test's workers send it
again once, as the reference worker does, and count it, so it cannot hide a lock problem.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_cli import installer, sqlfiles
from pgflow_cli.installer.events import Retrying
from pgflow_cli.worker import Flow, ProtocolV1
from pgflow_cli.worker.protocol import ProtocolV2, for_version
from tests.support.levels import versions_after

PRODUCERS = 6
WORKERS = 2
PRODUCER_PAUSE = 0.02
"""Seconds between one producer's calls (so two workers on a busy 2-core machine keep up)."""
FLOW = "liveFlow"


def _flow() -> Flow:
    return Flow(FLOW).step("first", lambda run, ctx: 1).step("second", lambda deps, ctx: 2, depends_on=["first"])


@dataclass
class Traffic:
    """Counters and errors shared by the traffic threads."""

    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    started_runs: list[uuid.UUID] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    errors: list[tuple[str, str | None, str]] = field(default_factory=list)
    stale_row_type: list[tuple[str, str]] = field(default_factory=list)

    def count(self, who: str) -> None:
        with self.lock:
            self.calls[who] = self.calls.get(who, 0) + 1

    def error(self, who: str, exc: psycopg.Error) -> None:
        with self.lock:
            self.errors.append((who, exc.sqlstate, str(exc).splitlines()[0]))

    def wait_for(self, predicate, what: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.calls} {self.errors[:5]}"
            time.sleep(0.02)


def _producer(conninfo: str, name: str, traffic: Traffic) -> None:
    with psycopg.connect(conninfo, autocommit=True, application_name=name) as conn:
        while not traffic.stop.is_set():
            try:
                row = conn.execute("SELECT run_id FROM pgflow.start_flow(%s, %s)", (FLOW, Jsonb({"n": 1}))).fetchone()
            except psycopg.Error as exc:
                traffic.error(name, exc)
                continue
            with traffic.lock:
                traffic.started_runs.append(row[0])
            traffic.count(name)
            traffic.stop.wait(PRODUCER_PAUSE)  # load shaping: two workers must keep up


def _worker(conninfo: str, name: str, traffic: Traffic) -> None:
    """Speaks the database's protocol: 1 until it refuses (PF002 once 0003 committed), then 2."""
    handlers = {"first": 1, "second": 2}
    with psycopg.connect(conninfo, autocommit=True, application_name=name) as conn:
        protocol, worker_id = _register(conn, name, for_version(ProtocolV1().database_version(conn)))
        while not traffic.stop.is_set():
            try:
                queue = protocol.queue_name(FLOW, None)
                ids = protocol.read(conn, queue_name=queue, vt=30, qty=20, max_poll_seconds=1, poll_interval_ms=50)
                if not ids:
                    continue
                outcome = protocol.claim(conn, flow_slug=FLOW, step_slug=None, queue_name=queue, message_ids=ids,
                                         worker_id=worker_id)
                for kind in ("duplicates", "archived_terminal", "archived_foreign", "missing", "released",
                             "fatal_messages"):
                    if getattr(outcome, kind):
                        traffic.count(f"{name}:{kind}")
                for task in outcome.claimed:
                    try:
                        protocol.complete(conn, task, handlers[task.step_slug])
                    except psycopg.errors.DatatypeMismatch as exc:
                        # Known, not a lock problem (see the module docstring): retried once.
                        traffic.stale_row_type.append((name, str(exc).splitlines()[0]))
                        protocol.complete(conn, task, handlers[task.step_slug])
                    traffic.count(name)
            except psycopg.Error as exc:
                if exc.sqlstate == "PF002" and protocol.version == 1:
                    # the upgrade committed: this worker restarts as a new-release worker
                    protocol, worker_id = _register(conn, name, ProtocolV2())
                    continue
                traffic.error(name, exc)


def _register(conn: psycopg.Connection, name: str, protocol: ProtocolV1) -> tuple[ProtocolV1, str]:
    if protocol.version > 1:
        protocol.compile(conn, FLOW, _flow().shape(), None)
    worker_id = str(uuid.uuid4())
    protocol.register(conn, worker_id=worker_id, function_name=name, queue_name=protocol.queue_name(FLOW, None),
                      flow_slug=FLOW, step_slug=None)
    return protocol, worker_id


def _maintenance(conninfo: str, traffic: Traffic) -> None:
    with psycopg.connect(conninfo, autocommit=True, application_name="maintenance") as conn:
        while not traffic.stop.is_set():
            for call in ("SELECT pgflow.requeue_stalled_tasks()",
                         "SELECT pgflow.prune_data_older_than(interval '1 hour')"):
                try:
                    conn.execute(call)
                except psycopg.Error as exc:
                    traffic.error("maintenance", exc)
                else:
                    traffic.count("maintenance")


@pytest.mark.parametrize("online", ["never", "always"])
def test_producers_workers_and_maintenance_run_through_the_migration(baseline_db, online):
    admin = baseline_db.connect()
    admin.execute(sqlfiles.load("optional/prune_baseline.sql"))
    ProtocolV1().compile(admin, FLOW, _flow().shape(), None)
    traffic = Traffic()
    threads = [threading.Thread(target=_producer, args=(baseline_db.conninfo, f"producer-{i}", traffic), daemon=True)
               for i in range(PRODUCERS)]
    threads += [threading.Thread(target=_worker, args=(baseline_db.conninfo, f"worker-{i}", traffic), daemon=True)
                for i in range(WORKERS)]
    threads.append(threading.Thread(target=_maintenance, args=(baseline_db.conninfo, traffic), daemon=True))
    for thread in threads:
        thread.start()
    try:
        # everyone is busy before the migration starts
        names = [f"producer-{i}" for i in range(PRODUCERS)] + [f"worker-{i}" for i in range(WORKERS)] + ["maintenance"]
        traffic.wait_for(lambda: all(traffic.calls.get(n, 0) >= 3 for n in names), "traffic to start")
        before = dict(traffic.calls)
        retries: list[Retrying] = []
        results = installer.apply(admin, lock_timeout=30, attempts=3, online=online,
                                  progress=lambda event: retries.append(event) if isinstance(event, Retrying) else None)
        assert [r.migration.version for r in results] == [3, *versions_after(3)]
        # and still busy after it: every producer got through again, the workers speak protocol 2
        after_migration = dict(traffic.calls)
        traffic.wait_for(lambda: all(traffic.calls.get(n, 0) >= after_migration.get(n, 0) + 3 for n in names),
                         "traffic after the migration")
    finally:
        traffic.stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert traffic.errors == [], "\n".join(map(str, traffic.errors))
    # the migrator never deadlocks; on a loaded machine a lock-timeout retry (bounded, nothing held
    # while waiting) is expected behaviour, not a failure
    assert [r for r in retries if "lock timeout" not in r.error] == [], retries
    assert all(after_migration[n] > before[n] for n in names if n.startswith("producer"))
    started = set(traffic.started_runs)
    assert started, "no run was started"
    # no run lost: every run the producers started exists and finishes
    traffic.stop.clear()
    drain = [threading.Thread(target=_worker, args=(baseline_db.conninfo, f"drainer-{i}", traffic), daemon=True)
             for i in range(WORKERS)]
    for thread in drain:
        thread.start()
    try:
        def finished() -> bool:
            row = admin.execute(
                "SELECT count(*) FILTER (WHERE status = 'completed'), count(*) FROM pgflow.runs WHERE run_id = ANY(%s)",
                (list(started),)).fetchone()
            assert row[1] == len(started), f"{len(started) - row[1]} started run(s) are gone"
            if row[0] != len(started):
                print(admin.execute("SELECT status, queue_name, count(*) FROM pgflow.step_tasks GROUP BY 1, 2").fetchall(),
                      admin.execute("SELECT * FROM pgflow.worker_functions").fetchall(),
                      admin.execute("SELECT queue_name, count(*) FROM pgmq.q_liveflow, pgmq.meta GROUP BY 1").fetchall())
            return row[0] == len(started)
        traffic.wait_for(finished, "every run to complete")
    finally:
        traffic.stop.set()
        for thread in drain:
            thread.join(timeout=30)
    assert traffic.errors == []

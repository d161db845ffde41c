"""`pgflow workers list` / `forget`: worker rows, and deleting those long dead, in one transaction,
never a row whose worker holds a task or heartbeats meanwhile."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from pgflow_cli import db as pgdb
from pgflow_cli.errors import ExitCode
from pgflow_cli.operations import workers as op
from tests.status.conftest import claim_one, validate
from tests.support.cli import run_cli


def _worker(conn, *, flow: str | None = "orders", queue: str = "orders", age: str = "0 s",
            stopped: bool = False) -> str:
    worker_id = str(uuid.uuid4())
    conn.execute("INSERT INTO pgflow.workers (worker_id, queue_name, function_name, flow_slug, last_heartbeat_at, "
                 "stopped_at) VALUES (%s, %s, 'orders-fn', %s, now() - %s::interval, "
                 "CASE WHEN %s THEN now() - %s::interval END)", (worker_id, queue, flow, age, stopped, age))
    return worker_id


@pytest.fixture
def orders(db):
    conn = db.connect()
    conn.execute("SELECT pgflow.create_flow('orders')")
    conn.execute("SELECT pgflow.add_step('orders', 'work')")
    return conn


def _ids(conn) -> set[str]:
    return {str(r[0]) for r in conn.execute("SELECT worker_id FROM pgflow.workers").fetchall()}


def test_list_shows_states_routes_and_tasks_in_flight(db, orders):
    live, stale = _worker(orders), _worker(orders, age="2 days")
    stopped = _worker(orders, age="3 days", stopped=True)
    orders.execute("SELECT pgflow.start_flow('orders', '{}'::jsonb)")
    holder = "00000000-0000-4000-8000-0000000057a3"
    assert claim_one(orders, "orders", holder) == 1
    result = run_cli("workers", "list", "--dsn", db.conninfo, "--format", "json")
    assert result.code == ExitCode.OK, result.output
    document = validate(result.stdout, "workers-list")
    rows = {w["worker_id"]: w for w in document["workers"]}
    assert (rows[live]["state"], rows[stale]["state"], rows[stopped]["state"]) == ("live", "stale", "stopped")
    assert rows[holder]["tasks_in_flight"] == 1 and rows[live]["tasks_in_flight"] == 0
    assert rows[live]["serves"] == ["orders"]
    assert document["workers"][0]["state"] == "stale"  # what needs a look comes first
    assert document["counts"] == {"stale": 1, "draining": 0, "live": 2, "stopped": 1}
    text = run_cli("workers", "list", "--dsn", db.conninfo, "--stale-for", "1d", "--format", "plain")
    assert stale in text.stdout and stopped in text.stdout and live not in text.stdout


def test_forget_deletes_long_dead_rows_without_tasks_in_flight(db, orders):
    live, stale, stopped = _worker(orders), _worker(orders, age="2 days"), _worker(orders, age="3 days", stopped=True)
    recent = _worker(orders, age="2 hours")
    orders.execute("SELECT pgflow.start_flow('orders', '{}'::jsonb)")
    holder = "00000000-0000-4000-8000-0000000057a4"
    assert claim_one(orders, "orders", holder) == 1
    orders.execute("UPDATE pgflow.workers SET last_heartbeat_at = now() - interval '5 days' WHERE worker_id = %s",
                   (holder,))
    dry = run_cli("workers", "forget", "--stale-for", "1d", "--dry-run", "--dsn", db.conninfo, "--format", "json")
    assert dry.code == ExitCode.OK, dry.output
    assert sorted(validate(dry.stdout, "workers-forget")["forgotten"]) == sorted([stale, stopped])
    assert _ids(orders) == {live, stale, stopped, recent, holder}  # the dry run changed nothing

    result = run_cli("workers", "forget", "--stale-for", "1d", "--yes", "--dsn", db.conninfo, "--format", "json")
    assert result.code == ExitCode.OK, result.output
    document = validate(result.stdout, "workers-forget")
    assert sorted(document["forgotten"]) == sorted([stale, stopped])
    assert document["kept"] == [{"worker_id": holder, "tasks_in_flight": 1}]
    assert _ids(orders) == {live, recent, holder}


def test_forget_keeps_a_finished_task_and_forgets_its_worker(db, orders):
    orders.execute("SELECT pgflow.start_flow('orders', '{}'::jsonb)")
    holder = "00000000-0000-4000-8000-0000000057a5"
    assert claim_one(orders, "orders", holder) == 1
    orders.execute("SELECT pgflow.complete_task(run_id, step_slug, task_index, '1'::jsonb) FROM pgflow.step_tasks")
    orders.execute("UPDATE pgflow.workers SET last_heartbeat_at = now() - interval '2 days'")
    report = op.forget(orders, stale_for=86400)
    assert report.forgotten == [holder]
    assert orders.execute("SELECT status, last_worker_id FROM pgflow.step_tasks").fetchall() == [("completed", None)]


def test_a_worker_that_heartbeats_while_forget_waits_for_its_row_is_kept(db, orders):
    stale = _worker(orders, age="2 days")
    heartbeat = db.connect(autocommit=False)
    heartbeat.execute("UPDATE pgflow.workers SET last_heartbeat_at = now() WHERE worker_id = %s", (stale,))
    outcome: list[object] = []
    forgetter = db.connect()
    pid = forgetter.info.backend_pid

    def run() -> None:
        try:
            outcome.append(op.forget(forgetter, stale_for=86400, lock_timeout=60))
        except Exception as exc:  # reported by the assertion below
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    watcher = db.connect()
    deadline = time.monotonic() + 30
    while not watcher.execute("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted)",
                              (pid,)).fetchone()[0]:
        assert time.monotonic() < deadline and thread.is_alive(), f"forget never waited for the row: {outcome}"
        time.sleep(0.01)
    heartbeat.commit()
    thread.join(30)
    assert not thread.is_alive()
    (report,) = outcome
    assert isinstance(report, op.ForgetReport), report
    assert report.forgotten == [] and [w.worker_id for w in report.kept] == [stale]
    assert _ids(orders) == {stale}


def test_forget_refuses_a_short_duration_and_asks_for_yes_off_a_terminal(db, orders):
    stale = _worker(orders, age="2 days")
    short = run_cli("workers", "forget", "--stale-for", "30s", "--yes", "--dsn", db.conninfo)
    assert short.code == ExitCode.USAGE and "at least 60 seconds" in short.stderr
    unconfirmed = run_cli("workers", "forget", "--stale-for", "1d", "--dsn", db.conninfo)
    assert unconfirmed.code == ExitCode.USAGE and "--yes" in unconfirmed.stderr
    bad = run_cli("workers", "forget", "--stale-for", "soon", "--yes", "--dsn", db.conninfo)
    assert bad.code == ExitCode.USAGE and "not a duration" in bad.stderr
    assert _ids(orders) == {stale}


def test_list_at_the_baseline(baseline_db):
    conn = baseline_db.connect()
    conn.execute("SELECT pgflow.create_flow('orders')")
    _worker(conn, flow=None, queue="Orders", age="1 hour")
    result = run_cli("workers", "list", "--dsn", baseline_db.conninfo, "--format", "json")
    assert result.code == ExitCode.OK, result.output
    (row,) = validate(result.stdout, "workers-list")["workers"]
    assert row["serves"] == ["orders"] and row["state"] == "stale"


def test_a_lock_held_past_the_timeout_is_exit_4(db, orders):
    stale = _worker(orders, age="2 days")
    holder = db.connect(autocommit=False)
    holder.execute("SELECT 1 FROM pgflow.workers WHERE worker_id = %s FOR UPDATE", (stale,))
    with pytest.raises(Exception) as raised:
        op.forget(db.connect(), stale_for=86400, lock_timeout=0.2)
    assert pgdb.map_database_error(raised.value).exit_code == ExitCode.LOCK_TIMEOUT
    holder.rollback()
    assert _ids(orders) == {stale}

"""How a migration takes its lock plan and backfills rows next to runtime calls that lock in
another order: the runtime call is never the deadlock victim, and the migration gets through.

Each test builds the exact interleaving with real connections and waits for lock states in
``pg_locks`` (who waits for whom, since when), never for a fixed time. The database's
``deadlock_timeout`` is raised to 3 s so the windows the server's deadlock check leaves are wide
compared with a busy machine's scheduling delays.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from pgflow_cli import installer
from pgflow_cli.installer.events import Event, PhaseStarted, Retrying
from pgflow_cli.installer.files import TableLock
from pgflow_cli.worker import Flow
from pgflow_cli.worker.protocol import ProtocolV2
from tests.worker.helpers import wait_until

DEADLOCK_TIMEOUT = 3.0
PLAN = (TableLock("pgflow.steps", "ACCESS EXCLUSIVE"), TableLock("pgflow.step_tasks", "ACCESS EXCLUSIVE"))


@pytest.fixture
def slow_deadlock_check(harness):
    """Sets ``deadlock_timeout`` for a test database (new sessions see it)."""
    def apply(database) -> None:
        harness.admin.execute(f'ALTER DATABASE "{database.name}" SET deadlock_timeout = {int(DEADLOCK_TIMEOUT * 1000)}')
    return apply


def _wait_until(observer: psycopg.Connection, query: str, params: tuple, what: str, timeout: float = 60) -> tuple:
    """The first row of ``query`` whose columns are all set and not false, polled every 5 ms (the
    waits here are measured against deadlock_timeout, so the state is seen as soon as it holds)."""
    def ready() -> tuple | None:
        row = observer.execute(query, params).fetchone()
        return row if row and all(v is not None and v is not False for v in row) else None

    return wait_until(ready, what, timeout=timeout, interval=0.005)


WAITING_ON = """
SELECT extract(epoch FROM clock_timestamp() - l.waitstart)::float8 >= %s
FROM pg_locks AS l
WHERE l.pid = %s AND NOT l.granted AND l.relation = to_regclass(%s) AND l.waitstart IS NOT NULL
"""


class _Background:
    """Runs one call in a thread and keeps its result or its error."""

    def __init__(self, action: Callable[[], object]) -> None:
        self.result: object = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.result = action()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 60) -> object:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the call did not finish"
        if self.error:
            raise self.error
        return self.result


def _take_plan(conn: psycopg.Connection) -> int:
    with conn.transaction():
        return installer.take_locks(conn, PLAN, lock_timeout=30)


def test_a_call_queued_behind_the_migrators_first_lock_is_never_the_deadlock_victim(db, slow_deadlock_check):
    """The interleaving that killed a worker: it holds step_tasks and queues for steps behind the
    migrator, the migrator then gets steps and needs step_tasks. The worker's deadlock check comes
    deadlock_timeout after *its* wait began, which was long before the migrator got steps."""
    slow_deadlock_check(db)
    observer = db.connect()
    reader = db.connect(autocommit=False)  # holds steps, so the migrator has to queue for it
    reader.execute("SELECT count(*) FROM pgflow.steps")
    migrator = db.connect()
    plan = _Background(lambda: _take_plan(migrator))
    _wait_until(observer, WAITING_ON, (0, migrator.info.backend_pid, "pgflow.steps"), "the migrator to queue for steps")

    worker = db.connect(autocommit=False)
    worker.execute("LOCK TABLE pgflow.step_tasks IN ROW EXCLUSIVE MODE")  # as complete_task's first statement
    worker_pid = worker.info.backend_pid
    reads_steps = _Background(lambda: worker.execute("SELECT count(*) FROM pgflow.steps").fetchone())
    # the worker has waited for two thirds of deadlock_timeout when the migrator gets steps
    _wait_until(observer, WAITING_ON, (DEADLOCK_TIMEOUT * 2 / 3, worker_pid, "pgflow.steps"),
                "the worker to wait for steps behind the migrator")
    reader.commit()

    reads_steps.join()  # no 40P01: the migrator saw the cycle and gave steps back at once
    worker.commit()
    assert plan.join() >= 2  # and it got the whole plan on a later try


def test_a_busy_lock_that_closes_no_cycle_is_waited_for(db, slow_deadlock_check):
    """A holder that waits for nobody: the migrator keeps steps and waits for step_tasks for as
    long as the holder needs (here longer than deadlock_timeout), in one try."""
    slow_deadlock_check(db)
    observer = db.connect()
    holder = db.connect(autocommit=False)
    holder.execute("SELECT count(*) FROM pgflow.step_tasks")
    migrator = db.connect()
    plan = _Background(lambda: _take_plan(migrator))
    _wait_until(observer, """
        SELECT extract(epoch FROM clock_timestamp() - a.xact_start)::float8 > %s
               AND EXISTS (SELECT 1 FROM pg_locks AS l WHERE l.pid = a.pid AND NOT l.granted
                             AND l.relation = 'pgflow.step_tasks'::regclass)
        FROM pg_stat_activity AS a WHERE a.pid = %s""", (DEADLOCK_TIMEOUT * 1.2, migrator.info.backend_pid),
        "the migrator to wait for step_tasks past deadlock_timeout")
    holder.commit()
    assert plan.join() == 1


def test_a_backfill_range_never_deadlocks_with_a_worker_holding_its_rows(baseline_db, slow_deadlock_check):
    """Phased 0003 backfill: the range waits for a row a worker updated, then the worker waits
    for a row the range updated earlier. Before the range ran in bounded time the server broke
    the cycle by killing one of them (the migrator, or the worker when it had waited first)."""
    slow_deadlock_check(baseline_db)
    admin = baseline_db.connect()
    admin.execute("SELECT pgflow.create_flow('rows')")
    admin.execute("SELECT pgflow.add_step('rows', 'only')")
    admin.execute("SELECT pgflow.start_flow('rows', '{}'::jsonb) FROM generate_series(1, 200)")
    first_row, last_row = admin.execute(
        "SELECT min(ctid), max(ctid) FROM pgflow.step_tasks").fetchone()
    assert str(first_row).split(",")[0] != str(last_row).split(",")[0], "the tasks must span two pages"
    touch = "UPDATE pgflow.step_tasks SET attempts_count = attempts_count WHERE ctid = %s::tid"
    worker = baseline_db.connect(autocommit=False)
    events: list[Event] = []

    def progress(event: Event) -> None:
        events.append(event)
        if isinstance(event, PhaseStarted) and event.phase == "backfill":
            worker.execute(touch, (str(last_row),))  # the worker holds the range's last row

    migrator = baseline_db.connect()
    migration = _Background(lambda: installer.apply(migrator, target=3, online="always", progress=progress,
                                                    lock_timeout=30, attempts=3))
    _wait_until(baseline_db.connect(), """
        SELECT true FROM pg_locks AS l
        WHERE l.pid = %s AND NOT l.granted AND l.locktype = 'transactionid'""", (migrator.info.backend_pid,),
        "the backfill to wait for the worker's row")
    worker.execute(touch, (str(first_row),))  # returns: the range gave its rows back (no 40P01)
    worker.commit()
    migration.join(120)
    assert [e for e in events if isinstance(e, Retrying)] == []  # neither a deadlock nor a lock timeout of the migration
    assert admin.execute("SELECT count(*) FROM pgflow.step_tasks WHERE queue_name IS NULL").fetchone()[0] == 0


def _table_order(database, statement: str, params: tuple) -> list[str]:
    """The order in which one call first locks the pgflow tables: every table is held ACCESS
    EXCLUSIVE by its own session; each time the call waits for one, that session lets go."""
    observer = database.connect()
    tables = [r[0] for r in observer.execute(
        "SELECT c.relname::text FROM pg_class AS c WHERE c.relnamespace = 'pgflow'::regnamespace "
        "AND c.relkind = 'r' AND c.relname NOT LIKE 'schema\\_%'").fetchall()]
    holders = {}
    for table in tables:
        holder = database.connect(autocommit=False)
        holder.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier("pgflow", table)))
        holders[table] = holder
    caller = database.connect(autocommit=False)
    call = _Background(lambda: caller.execute(statement, params).fetchall())
    order: list[str] = []
    while call.thread.is_alive():
        row = observer.execute("SELECT c.relname::text FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation "
                               "WHERE l.pid = %s AND NOT l.granted", (caller.info.backend_pid,)).fetchone()
        if row and row[0] in holders:
            order.append(row[0])
            holders.pop(row[0]).commit()
        time.sleep(0.005)
    call.join()
    caller.commit()
    for holder in holders.values():
        holder.commit()
    return order


def test_the_runtime_locks_tables_in_no_single_order(db):
    """Why the lock plan cannot rely on an order: start_flow reaches steps before step_tasks,
    complete_task step_tasks before steps (docs/architecture.md "Locks a migration takes")."""
    conn = db.connect()
    protocol = ProtocolV2()
    flow = Flow("ordered").step("only", lambda value, ctx: None)
    protocol.compile(conn, "ordered", flow.shape(), None)
    started = _table_order(db, "SELECT run_id FROM pgflow.start_flow('ordered', %s)", (Jsonb({}),))
    assert started.index("steps") < started.index("step_tasks"), started
    worker_id = "00000000-0000-0000-0000-0000000000aa"
    protocol.register(conn, worker_id=worker_id, function_name="w", queue_name="ordered", flow_slug="ordered",
                      step_slug=None)
    ids = protocol.read(conn, queue_name="ordered", vt=60, qty=1, max_poll_seconds=1, poll_interval_ms=20)
    [task] = protocol.claim(conn, flow_slug="ordered", step_slug=None, queue_name="ordered", message_ids=ids,
                            worker_id=worker_id).claimed
    completed = _table_order(db, "SELECT count(*) FROM pgflow.complete_task(%s, %s, %s, %s)",
                             (task.run_id, task.step_slug, task.task_index, Jsonb(1)))
    assert completed.index("step_tasks") < completed.index("steps"), completed

"""What `pgflow prune` deletes and what it never touches, on real runs driven through the runtime."""

from __future__ import annotations

import psycopg
import pytest

from pgflow_cli.operations import prune as op
from tests.prune.helpers import CUTOFF_DAYS, age_archive, age_run, build_history

DAYS = CUTOFF_DAYS * 86400.0


def counts(rt, run_ids) -> dict[str, int]:
    ids = list(run_ids)
    return {table: rt.val(f"SELECT count(*) FROM pgflow.{table} WHERE run_id = ANY (%s)", (ids,))
            for table in ("runs", "step_states", "step_tasks")}


def test_finished_runs_before_the_cutoff_go_with_their_states_and_tasks_and_nothing_else(rt, db):
    history = build_history(rt)
    before_kept = counts(rt, history.kept)
    gone_rows = counts(rt, history.gone)
    assert gone_rows == {"runs": 4, "step_states": 8, "step_tasks": 7}  # the failed run never started b

    with db.connect() as conn:
        report = op.prune(conn, older_than=DAYS, batch_size=2)

    assert counts(rt, history.gone) == {"runs": 0, "step_states": 0, "step_tasks": 0}
    assert counts(rt, history.kept) == before_kept
    t = report.totals
    assert (t.runs, t.step_states, t.step_tasks) == (4, 8, 7)
    assert t.runs_by_status == {"completed": 3, "failed": 1}
    assert (t.skipped_locked, t.kept_open_tasks, t.scanned) == (0, 0, 7)
    assert report.complete
    # the flow and its definition stay
    assert rt.val("SELECT count(*) FROM pgflow.steps WHERE flow_slug = 'orders'") == 2


def test_the_tables_referring_to_runs_are_the_ones_prune_runs_deletes(rt):
    referring = {r["table"]: r["cascade"] for r in rt.rows(
        "SELECT conrelid::regclass::text AS table, confdeltype = 'c' AS cascade FROM pg_constraint "
        "WHERE contype = 'f' AND confrelid = 'pgflow.runs'::regclass")}
    with_run_id = {r["table"] for r in rt.rows(
        "SELECT c.oid::regclass::text AS table FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid "
        "WHERE c.relnamespace = 'pgflow'::regnamespace AND c.relkind IN ('r', 'p') AND a.attname = 'run_id' "
        "AND NOT a.attisdropped")}
    # the tables kept beside a run (its lineage, its cancel) go with it by ON DELETE CASCADE
    assert referring == {"pgflow.step_states": False, "pgflow.step_tasks": False,
                         "pgflow.run_restarts": True, "pgflow.run_cancellations": True}
    assert with_run_id == {"pgflow.runs", *referring}
    source = rt.val("SELECT prosrc FROM pg_proc WHERE oid = 'pgflow.prune_runs'::regproc")
    for table in with_run_id:
        assert (f"DELETE FROM {table} " in source) != referring.get(table, False), table


def test_a_dry_run_changes_nothing_and_counts_what_the_prune_then_deletes(rt, db):
    history = build_history(rt)
    rt.conn.execute("SELECT pgflow.mark_worker_stopped(%s)", (rt.worker_for("orders"),))
    rt.conn.execute("UPDATE pgflow.workers SET last_heartbeat_at = now() - interval '40 days'")
    queue = rt.queue("orders")
    assert age_archive(rt, queue) > 0
    fingerprint = ("SELECT (SELECT count(*) FROM pgflow.runs) AS runs, (SELECT count(*) FROM pgflow.step_tasks) AS tasks, "
                   "(SELECT count(*) FROM pgflow.workers) AS workers, (SELECT count(*) FROM pgmq.a_orders) AS archived")
    before = list(rt.one(fingerprint).values())
    with db.connect() as conn:
        dry = op.prune(conn, older_than=DAYS, batch_size=3, dry_run=True)
    assert list(rt.one(fingerprint).values()) == before
    with db.connect() as conn:
        real = op.prune(conn, older_than=DAYS, batch_size=3)
    assert dry.totals.to_dict() | {"batches": 0} == real.totals.to_dict() | {"batches": 0}
    assert real.totals.runs == len(history.gone)
    # the worker holding the in-flight task stays, though silent for 40 days: its task is in flight
    assert real.totals.workers == 0 and rt.val("SELECT count(*) FROM pgflow.workers") == 1
    assert real.totals.archives == {queue: before[3]} and rt.val("SELECT count(*) FROM pgmq.a_orders") == 0


def test_worker_rows_silent_since_the_cutoff_go_unless_they_hold_a_task(rt, db):
    build_history(rt)
    holder = rt.worker_for("orders")
    idle = rt.worker  # registered, never claimed
    rt.conn.execute("UPDATE pgflow.workers SET last_heartbeat_at = now() - interval '40 days'")
    live = rt.val("SELECT gen_random_uuid()")
    rt.conn.execute("SELECT pgflow.register_worker(%s, 'test-worker', 'orders', 'orders')", (live,))
    with db.connect() as conn:
        report = op.prune(conn, older_than=DAYS)
    assert report.totals.workers == 1
    assert {r["worker_id"] for r in rt.rows("SELECT worker_id FROM pgflow.workers")} == {holder, live}
    assert idle not in {r["worker_id"] for r in rt.rows("SELECT worker_id FROM pgflow.workers")}


def test_archive_rows_before_the_cutoff_go_in_batches_and_newer_ones_stay(rt, db):
    rt.flow("busy", [{"slug": "a"}])
    for i in range(25):
        rt.start("busy", {"i": i})
    rt.drive("busy", lambda task: 1)
    assert age_archive(rt, "busy") == 25
    rt.start("busy", {"new": 1})
    rt.drive("busy", lambda task: 1)  # one archive row of today
    with db.connect() as conn:
        report = op.prune(conn, older_than=DAYS, batch_size=1)  # 10 archive rows per batch
    assert report.totals.archives == {"busy": 25}
    assert rt.val("SELECT count(*) FROM pgmq.a_busy") == 1
    assert report.totals.batches >= 1 + 26 + 1 + 3  # runs pages (26 runs, 1 per page, then the empty one), ...


def test_prune_archive_refuses_a_queue_no_step_routes_to(rt):
    rt.conn.execute("SELECT pgmq.create('foreign_queue')")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="no step routes to queue 'foreign_queue'"):
        rt.conn.execute("SELECT pgflow.prune_archive('foreign_queue', now(), 10)")


@pytest.mark.parametrize("args", [("NULL", "10"), ("now()", "0"), ("now()", "10001")])
def test_prune_runs_refuses_a_bad_cutoff_or_batch_size(rt, args):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="prune_runs"):
        rt.conn.execute(f"SELECT pgflow.prune_runs({args[0]}, NULL, {args[1]})")


def test_a_stopped_prune_is_finished_by_running_it_again(rt, db):
    rt.flow("many", [{"slug": "a"}])
    runs = [rt.start("many", {"i": i}) for i in range(12)]
    rt.drive("many", lambda task: 1)
    for run_id in runs:
        age_run(rt, run_id)
    cutoff = rt.val("SELECT now() - interval '30 days'")
    # two batches commit, the third is killed with its transaction open (rolled back)
    first = rt.val("SELECT pgflow.prune_runs(%s, NULL, 4)", (cutoff,))
    second = rt.val("SELECT pgflow.prune_runs(%s, %s, 4)", (cutoff, first["last_run_id"]))
    assert first["runs"] + second["runs"] == 8
    killed = db.connect()
    killed.autocommit = False
    killed.execute("SELECT pgflow.prune_runs(%s, %s, 4)", (cutoff, second["last_run_id"]))
    killed.close()  # the connection dies inside the batch's transaction
    assert rt.val("SELECT count(*) FROM pgflow.runs") == 4
    with db.connect() as conn:
        again = op.prune(conn, older_than=DAYS, batch_size=4)
    assert again.totals.runs == 4 and rt.val("SELECT count(*) FROM pgflow.runs") == 0
    assert rt.val("SELECT count(*) FROM pgflow.step_tasks") == 0


def test_a_finished_run_with_a_task_still_open_is_kept(rt, db):
    """Data written before the truthful-terminal-state fixes: a failed run with a started task."""
    history = build_history(rt)
    odd = history.gone[0]
    rt.conn.execute("ALTER TABLE pgflow.step_tasks DISABLE TRIGGER USER")
    rt.conn.execute("UPDATE pgflow.step_tasks SET status = 'started', completed_at = NULL, output = NULL "
                    "WHERE run_id = %s AND step_slug = 'b'", (odd,))
    rt.require_live_messages = False  # this task has no message: the state pruning must not touch
    with db.connect() as conn:
        report = op.prune(conn, older_than=DAYS)
    assert report.totals.kept_open_tasks == 1 and report.totals.runs == 3
    assert counts(rt, [odd]) == {"runs": 1, "step_states": 2, "step_tasks": 2}
    rt.conn.execute("DELETE FROM pgflow.step_tasks WHERE run_id = %s", (odd,))  # for the invariants
    rt.conn.execute("DELETE FROM pgflow.step_states WHERE run_id = %s", (odd,))
    rt.conn.execute("DELETE FROM pgflow.runs WHERE run_id = %s", (odd,))


def test_a_pruned_run_takes_its_restart_and_cancel_records_with_it_and_a_kept_restart_still_names_it(rt, db):
    rt.flow("redo", [{"slug": "a"}])
    source = rt.start("redo", {"n": 1})
    rt.one("SELECT * FROM pgflow.cancel_run(%s, 'wrong batch')", (source,))
    retry = rt.one("SELECT * FROM pgflow.retry_run(%s)", (source,))["run_id"]
    rt.one("SELECT * FROM pgflow.cancel_run(%s, 'again')", (retry,))
    resumed = rt.one("SELECT * FROM pgflow.resume_run(%s)", (retry,))["run_id"]
    records = ("SELECT (SELECT count(*) FROM pgflow.run_restarts WHERE run_id = ANY (%(ids)s)) AS restarts, "
               "(SELECT count(*) FROM pgflow.run_cancellations WHERE run_id = ANY (%(ids)s)) AS cancels")
    assert rt.one(records, {"ids": [source, retry]}) == {"restarts": 1, "cancels": 2}
    age_run(rt, source)
    age_run(rt, retry)

    with db.connect() as conn:
        report = op.prune(conn, older_than=DAYS, batch_size=10)

    assert report.totals.runs == 2
    assert rt.one(records, {"ids": [source, retry]}) == {"restarts": 0, "cancels": 0}
    # the run kept (still started) names its pruned source: the lineage has no foreign key to it
    assert rt.one("SELECT restart_of_run_id, restart_kind FROM pgflow.run_restarts WHERE run_id = %s",
                  (resumed,)) == {"restart_of_run_id": retry, "restart_kind": "resume"}

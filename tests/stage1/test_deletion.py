"""Whole-flow deletion on 0003: runtime rows, definition, the flow's queues and archives, in one transaction."""

from __future__ import annotations

import threading

from tests.runtime.driver import wait_until_blocked
from tests.stage1.conftest import upgrade

ARCHIVE_LOG = """
CREATE TABLE public.archive_log (queue text, msg_id bigint);
CREATE FUNCTION public.log_archive() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.archive_log VALUES (TG_TABLE_NAME, NEW.msg_id);
  RETURN NEW;
END $$;
"""


def _gone(rt, flow: str, queue: str) -> None:
    for table in ("flows", "steps", "deps", "runs", "step_states", "step_tasks"):
        assert rt.val(f"SELECT count(*) FROM pgflow.{table} WHERE flow_slug = %s", (flow,)) == 0, table
    assert rt.val("SELECT count(*) FROM pgmq.meta WHERE lower(queue_name) = %s", (queue,)) == 0
    assert rt.val("SELECT to_regclass(%s)", (f"pgmq.q_{queue}",)) is None
    assert rt.val("SELECT to_regclass(%s)", (f"pgmq.a_{queue}",)) is None


def _delete_in_thread(db, flow: str):
    deleter = db.connect()
    result: dict = {}

    def target():
        try:
            deleter.execute("SELECT pgflow.delete_flow_and_data(%s)", (flow,))
            result["ok"] = True
        except Exception as exc:  # surfaced by the test
            result["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    return deleter, thread, result


def test_delete_drops_the_flow_queue_and_archive_and_nothing_else(rt):
    rt.flow("Doomed", [{"slug": "a"}, {"slug": "each", "deps": ["a"], "step_type": "map"}])
    rt.flow("survivor", [{"slug": "a"}])
    done = rt.start("Doomed", {})
    rt.poll("Doomed")
    rt.complete(done, "a", 0, [])
    assert rt.run(done)["status"] == "completed" and len(rt.archived("doomed")) == 1
    live = rt.start("Doomed", {})
    queued = rt.start("Doomed", {})
    assert len(rt.claim("Doomed", [rt.task(live, "a")["message_id"]])) == 1
    keep = rt.start("survivor", {})
    rt.poll("survivor")
    rt.complete(keep, "a", 0, "kept")
    keep_live = rt.start("survivor", {})
    # a trigger records any archival into the doomed flow's archive: deletion drops, it does not archive
    rt.conn.execute(ARCHIVE_LOG)
    rt.conn.execute("CREATE TRIGGER log_archive AFTER INSERT ON pgmq.a_doomed FOR EACH ROW EXECUTE FUNCTION public.log_archive()")

    rt.conn.execute("SELECT pgflow.delete_flow_and_data('Doomed')")
    _gone(rt, "Doomed", "doomed")
    assert rt.rows("SELECT * FROM public.archive_log") == []
    assert rt.run(live) is None and rt.run(queued) is None
    # the other flow: definition, runs, queue, messages and archive untouched
    assert rt.run(keep)["status"] == "completed"
    assert [m["message"]["run_id"] for m in rt.messages("survivor")] == [str(keep_live)]
    assert len(rt.archived("survivor")) == 1
    [t] = rt.poll("survivor")
    rt.complete(keep_live, "a", 0, "still works")
    assert rt.run(keep_live)["status"] == "completed"
    # deleting again, or a flow that never existed, is a no-op
    rt.conn.execute("SELECT pgflow.delete_flow_and_data('Doomed')")
    rt.conn.execute("SELECT pgflow.delete_flow_and_data('never_was')")


def test_delete_drops_a_legacy_camelcase_queue_by_its_listed_spelling(old_rt, baseline_db):
    """A baseline flow "LegacyFlow" has its queue listed as "LegacyFlow" (table q_legacyflow); after the
    upgrade its route is "legacyflow". Deletion must drop it by the exact pgmq.meta spelling, or PGMQ
    leaves the meta row behind."""
    rt = old_rt
    rt.flow("LegacyFlow", [{"slug": "a"}])
    in_flight = rt.start("LegacyFlow", {})
    [claimed] = rt.poll("LegacyFlow")  # baseline worker, start_tasks
    waiting = rt.start("LegacyFlow", {})
    assert rt.val("SELECT array_agg(queue_name::text) FROM pgmq.meta") == ["LegacyFlow"]

    upgrade(baseline_db, rt)
    assert rt.val("SELECT queue_name FROM pgflow.steps WHERE flow_slug = 'LegacyFlow'") == "legacyflow"
    assert {t["queue_name"] for t in rt.tasks(in_flight) + rt.tasks(waiting)} == {"legacyflow"}
    assert rt.val("SELECT array_agg(queue_name::text) FROM pgmq.meta") == ["LegacyFlow"]  # nothing renamed
    # in-flight work of the released runtime finishes on the upgraded one
    rt.complete(in_flight, "a", 0, "done")
    assert rt.run(in_flight)["status"] == "completed"
    assert [m["msg_id"] for m in rt.archived("legacyflow")] == [claimed["msg_id"]]
    [t] = rt.poll("LegacyFlow")  # protocol 2: claim_tasks('legacyflow', ..., 'LegacyFlow')
    assert t["run_id"] == waiting
    # a protocol-2 worker starting after the upgrade verifies the legacy definition and its route
    doc = rt.val("SELECT pgflow._get_flow_shape('LegacyFlow')")
    verified = rt.compile("LegacyFlow", doc)
    assert (verified["status"], verified["routes"]) == ("verified", [{"stepSlug": "a", "queueName": "legacyflow"}])

    # what a drop by the generated spelling would do to such a queue: PGMQ keeps the listed row
    rt.conn.execute("SELECT pgmq.create('OtherCase')")
    rt.conn.execute("SELECT pgmq.drop_queue('othercase')")
    assert rt.val("SELECT array_agg(queue_name::text ORDER BY queue_name) FROM pgmq.meta") == ["LegacyFlow", "OtherCase"]
    rt.conn.execute("DELETE FROM pgmq.meta WHERE queue_name = 'OtherCase'")

    rt.conn.execute("SELECT pgflow.delete_flow_and_data('LegacyFlow')")
    _gone(rt, "LegacyFlow", "legacyflow")
    assert rt.val("SELECT count(*) FROM pgmq.meta") == 0


def test_delete_removes_runtime_rows_before_the_queue(rt, db):
    """Lock order: runs -> step_states -> step_tasks are locked and deleted before the queue table is touched."""
    rt.flow("ordered", [{"slug": "a"}, {"slug": "b"}])
    run = rt.start("ordered", {})
    rt.flow("bystander", [{"slug": "a"}])
    reader = db.connect(autocommit=False)
    reader.execute("SELECT count(*) FROM pgmq.q_ordered")  # holds ACCESS SHARE on the queue table

    deleter, thread, result = _delete_in_thread(db, "ordered")
    assert reader.info.backend_pid in wait_until_blocked(rt.conn, deleter.info.backend_pid)
    locks = rt.rows(
        """
        SELECT coalesce(l.relation::regclass::text, l.locktype) AS what, l.mode, l.granted
        FROM pg_locks l WHERE l.pid = %s AND l.locktype = 'relation'
        """,
        (deleter.info.backend_pid,),
    )
    held = {(x["what"], x["mode"]) for x in locks if x["granted"]}
    waiting = [(x["what"], x["mode"]) for x in locks if not x["granted"]]
    assert waiting == [("pgmq.q_ordered", "AccessExclusiveLock")]
    for table in ("pgflow.runs", "pgflow.step_states", "pgflow.step_tasks"):
        assert (table, "RowExclusiveLock") in held, table  # its rows are already deleted
    for table in ("pgflow.steps", "pgflow.flows", "pgflow.deps"):
        assert (table, "RowExclusiveLock") not in held, table  # the definition goes after the queue
    # nothing is visible to others before the deletion commits
    assert len(rt.tasks(run)) == 2

    reader.commit()
    thread.join(30)
    assert result.get("ok"), result
    _gone(rt, "ordered", "ordered")
    assert rt.val("SELECT array_agg(flow_slug) FROM pgflow.flows") == ["bystander"]


def test_delete_waits_for_a_worker_holding_task_rows(rt, db):
    """A claim in flight holds the run (share), its task rows and its message row; deletion waits on the
    run, then drops everything. The worker's later report finds nothing."""
    rt.flow("busy", [{"slug": "a"}])
    run = rt.start("busy", {})
    [msg] = rt.read("busy")
    worker = rt.worker_for("busy")
    worker_conn = db.connect(autocommit=False)
    rows = rt.claim_outcomes("busy", [msg["msg_id"]], worker, conn=worker_conn)
    assert [r["outcome"] for r in rows] == ["claimed"]

    deleter, thread, result = _delete_in_thread(db, "busy")
    assert worker_conn.info.backend_pid in wait_until_blocked(rt.conn, deleter.info.backend_pid)
    waiting = rt.rows("SELECT locktype, relation::regclass::text AS rel FROM pg_locks WHERE pid = %s AND NOT granted",
                      (deleter.info.backend_pid,))
    assert [w["locktype"] for w in waiting] in (["transactionid"], ["tuple"])  # a row lock, not a queue table
    worker_conn.commit()
    thread.join(30)
    assert result.get("ok"), result
    _gone(rt, "busy", "busy")
    assert rt.complete(run, "a", 0, "late") is None
    assert rt.fail(run, "a", 0, "late") is None

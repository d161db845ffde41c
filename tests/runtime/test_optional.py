"""Optional pieces: realtime broadcasts, pruning (sql/optional), queue helpers, privileges."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgflow_cli import sqlfiles


def _fake_realtime(rt):
    rt.conn.execute(
        """
        CREATE SCHEMA realtime;
        CREATE TABLE realtime.sent (id bigserial PRIMARY KEY, payload jsonb, event text, topic text, private boolean);
        CREATE FUNCTION realtime.send(payload jsonb, event text, topic text, private boolean DEFAULT true)
        RETURNS void LANGUAGE sql AS
          $$ INSERT INTO realtime.sent (payload, event, topic, private) VALUES (payload, event, topic, private) $$;
        """
    )


def test_no_realtime_needed(rt):
    assert rt.val("SELECT to_regnamespace('realtime')") is None
    rt.flow("quiet", [{"slug": "a"}])
    run = rt.start("quiet", {})
    rt.poll("quiet")
    rt.complete(run, "a", 0, 1)
    assert rt.run(run)["status"] == "completed"


def test_realtime_events_when_available(rt):
    _fake_realtime(rt)
    rt.flow("loud", [
        {"slug": "a"},
        {"slug": "b", "deps": ["a"], "required_input_pattern": {"a": 2}},
        {"slug": "c", "deps": ["a"], "max_attempts": 1},
    ])
    run = rt.start("loud", {"in": 1})
    rt.poll("loud")
    rt.complete(run, "a", 0, 1)
    rt.poll("loud")
    rt.fail(run, "c", 0, "bad")
    sent = rt.rows("SELECT * FROM realtime.sent ORDER BY id")
    assert {s["topic"] for s in sent} == {f"pgflow:run:{run}"}
    assert all(s["private"] is False for s in sent)
    assert [s["event"] for s in sent] == [
        "run:started",
        "step:a:started",
        "step:a:completed",
        "step:b:skipped",
        "step:c:started",
        "step:c:failed",
        "run:failed",
    ]
    by_event = {s["event"]: s["payload"] for s in sent}
    assert by_event["run:started"]["event_type"] == "run:started"
    assert by_event["run:started"]["input"] == {"in": 1}
    assert by_event["step:a:completed"]["output"] == 1
    assert by_event["step:b:skipped"]["skip_reason"] == "condition_unmet"
    assert by_event["step:c:failed"]["error_message"] == "bad"
    assert by_event["run:failed"]["error_message"] == "bad"


def test_run_completed_event(rt):
    _fake_realtime(rt)
    rt.flow("done", [{"slug": "a"}])
    run = rt.start("done", {})
    rt.poll("done")
    rt.complete(run, "a", 0, "x")
    last = rt.one("SELECT * FROM realtime.sent ORDER BY id DESC LIMIT 1")
    assert last["event"] == "run:completed"
    assert last["payload"]["output"] == {"a": "x"}


def test_queue_helpers_are_idempotent_and_count(rt):
    rt.flow("helpers", [{"slug": "each", "step_type": "map"}])
    run = rt.start("helpers", [1, 2, 3])
    runs, steps, indexes = [run, run, run, run], ["each", "each", "each", "nope"], [0, 1, 1, 0]
    changed = rt.val(
        "SELECT pgflow._set_task_messages_vt(%s::uuid[], %s, %s, ARRAY[100, 200, 200, 5])", (runs, steps, indexes)
    )
    assert changed == 2  # the duplicate key counts once, the unknown task is skipped
    tasks = rt.tasks(run)
    assert rt.vt_in("helpers", tasks[0]["message_id"]) == pytest.approx(100, abs=1.5)
    assert rt.vt_in("helpers", tasks[1]["message_id"]) == pytest.approx(200, abs=1.5)
    assert rt.vt_in("helpers", tasks[2]["message_id"]) <= 0.1  # untouched
    with pytest.raises(Exception, match="differ in length"):
        rt.val("SELECT pgflow._set_task_messages_vt(%s::uuid[], %s, %s, ARRAY[1])", (runs, steps, indexes))
    assert rt.val("SELECT pgflow._archive_task_messages(NULL, NULL, NULL)") == 0

    rt.make_visible("helpers")
    for t in rt.poll("helpers"):
        rt.complete(run, "each", t["task_index"], t["task_index"])
    assert rt.run(run)["status"] == "completed"
    assert len(rt.archived("helpers")) == 3
    # archiving again finds nothing left to archive
    assert rt.val("SELECT pgflow._archive_task_messages(%s::uuid[], %s, %s)", (runs, steps, indexes)) == 0


def test_set_vt_batch_compat(rt):
    rt.conn.execute("SELECT pgmq.create('plainq')")
    ids = [r["send"] for r in rt.rows("SELECT pgmq.send('plainq', '{}') UNION ALL SELECT pgmq.send('plainq', '{}')")]
    rows = rt.rows("SELECT * FROM pgflow.set_vt_batch('plainq', %s, ARRAY[50, 70])", (ids,))
    assert sorted(r["msg_id"] for r in rows) == sorted(ids)
    assert rt.vt_in("plainq", ids[1]) == pytest.approx(70, abs=1.5)
    assert rt.rows("SELECT * FROM pgflow.set_vt_batch('plainq', ARRAY[]::bigint[], ARRAY[]::int[])") == []


def _install_prune(rt):
    """The pruning file of this level: prune_baseline.sql (0002) or the queue-aware prune.sql (0003)."""
    rt.conn.execute(sqlfiles.load(rt.prune_file))


def test_prune_is_not_part_of_the_migrations(rt):
    assert rt.val("SELECT to_regprocedure('pgflow.prune_data_older_than(interval)')") is None
    assert Path(sqlfiles.sql_root(), rt.prune_file).is_file()


def test_prune_removes_only_old_finished_data(rt):
    _install_prune(rt)
    _install_prune(rt)  # reinstallable
    rt.flow("prunable", [{"slug": "a"}], max_attempts=1)
    old_done = rt.start("prunable", {})
    old_failed = rt.start("prunable", {})
    recent_done = rt.start("prunable", {})
    old_started = rt.start("prunable", {})
    tasks = {t["run_id"]: t for t in rt.poll("prunable")}
    rt.complete(old_done, "a", 0, 1)
    rt.fail(old_failed, "a", 0, "x")
    rt.complete(recent_done, "a", 0, 1)
    # age everything but recent_done by 100 days
    for run in (old_done, old_failed, old_started):
        rt.conn.execute(
            """
            UPDATE pgflow.runs SET started_at = started_at - interval '100 days',
                   completed_at = completed_at - interval '100 days', failed_at = failed_at - interval '100 days'
            WHERE run_id = %s
            """,
            (run,),
        )
    rt.conn.execute(
        "UPDATE pgmq.a_prunable SET archived_at = archived_at - interval '100 days' WHERE msg_id IN (%s, %s)",
        (tasks[old_done]["msg_id"], tasks[old_failed]["msg_id"]),
    )
    rt.conn.execute("UPDATE pgflow.workers SET last_heartbeat_at = now() - interval '100 days'")

    summary = rt.val("SELECT pgflow.prune_data_older_than(interval '90 days')")
    assert summary["runs"] == 2
    assert summary["archived_messages"] == 2
    assert summary["workers"] == 1
    assert rt.run(old_done) is None and rt.run(old_failed) is None
    assert rt.run(recent_done)["status"] == "completed"
    assert rt.run(old_started)["status"] == "started"  # never pruned, even if old
    assert rt.task(old_started, "a")["status"] == "started"
    assert rt.task(old_started, "a")["last_worker_id"] is None  # worker row pruned
    assert [m["msg_id"] for m in rt.archived("prunable")] == [tasks[recent_done]["msg_id"]]
    assert rt.val("SELECT count(*) FROM pgflow.flows") == 1
    # finish the old started run so the invariants stay meaningful (its message is still there)
    rt.complete(old_started, "a", 0, 1)


def test_prune_archives_live_messages_of_legacy_finished_runs(rt):
    """Data from before 0.15.1 can hold queued tasks under a finished run; pruning cleans their messages."""
    _install_prune(rt)
    rt.flow("legacy", [{"slug": "a"}, {"slug": "b"}])
    run = rt.start("legacy", {})
    rt.conn.execute(
        "UPDATE pgflow.runs SET status = 'failed', started_at = now() - interval '9 days',"
        " failed_at = now() - interval '8 days' WHERE run_id = %s",
        (run,),
    )
    rt.conn.execute("UPDATE pgflow.step_states SET status = 'failed', failed_at = now() WHERE run_id = %s AND step_slug = 'a'", (run,))
    summary = rt.val("SELECT pgflow.prune_data_older_than(interval '1 day')")
    assert summary["live_messages_archived"] == 2
    assert rt.messages("legacy") == []
    assert rt.val("SELECT count(*) FROM pgflow.step_tasks") == 0


def test_prune_rejects_negative_retention(rt):
    _install_prune(rt)
    with pytest.raises(Exception, match="non-negative"):
        rt.val("SELECT pgflow.prune_data_older_than(interval '-1 day')")


def test_nothing_is_executable_by_public(rt):
    _install_prune(rt)
    rt.conn.execute("CREATE ROLE pgflow_nobody NOLOGIN")
    try:
        open_functions = rt.rows(
            """
            SELECT p.oid::regprocedure::text AS fn
            FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname = 'pgflow' AND has_function_privilege('pgflow_nobody', p.oid, 'EXECUTE')
            """
        )
        assert open_functions == []
        count = rt.val("SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'pgflow'")
        assert count > 40
    finally:
        rt.conn.execute("DROP ROLE pgflow_nobody")


def test_every_function_pins_its_search_path(rt):
    _install_prune(rt)
    loose = rt.rows(
        """
        SELECT p.oid::regprocedure::text AS fn
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'pgflow'
          AND NOT coalesce(p.proconfig @> ARRAY['search_path=""'], false)
        """
    )
    assert loose == []


def test_security_definer_functions(rt):
    definers = {
        r["fn"]
        for r in rt.rows(
            "SELECT p.proname AS fn FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'pgflow' AND p.prosecdef"
        )
    }
    assert definers == {
        "start_flow_with_states",
        "get_run_with_states",
        "requeue_stalled_tasks",
        "setup_ensure_workers_cron",
        "setup_requeue_stalled_tasks_cron",
        "cleanup_ensure_workers_logs",
    }

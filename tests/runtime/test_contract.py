"""The queue-helper contract of docs/architecture.md, checked against the installed functions.

Every message mutation after the initial send (start_ready_steps) goes through
_archive_task_messages / _set_task_messages_vt, so the queue-identity migration can replace
just those two.
"""

from __future__ import annotations

import re

from pgflow_cli import sqlfiles

HELPERS = {"_archive_task_messages", "_set_task_messages_vt"}
# pgflow functions allowed to name PGMQ message operations directly, and why.
ALLOWED = {
    "_archive_task_messages": "the archive helper",
    "_set_task_messages_vt": "the visibility helper",
    "set_vt_batch": "upstream-compatible utility on an explicit queue name; the runtime never calls it",
    "start_ready_steps": "the initial send (pgmq.send_batch)",
    "create_flow": "creates the flow's queue",
    "delete_flow_and_data": "drops the flow's queue",
    "prune_data_older_than": "deletes old rows of archive tables (optional file)",
}
MESSAGE_OPS = re.compile(
    r"pgmq\.(archive|delete|set_vt|send|send_batch|pop|purge_queue|create|drop_queue)\s*\(|UPDATE\s+pgmq\.|DELETE\s+FROM\s+pgmq\.",
    re.IGNORECASE,
)


def test_only_the_helpers_touch_existing_messages(rt):
    rt.conn.execute(sqlfiles.load("optional/prune_baseline.sql"))
    functions = rt.rows(
        "SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'pgflow'"
    )
    users = {f["proname"] for f in functions if MESSAGE_OPS.search(f["prosrc"])}
    assert users - set(ALLOWED) == set(), f"functions touching PGMQ directly: {sorted(users - set(ALLOWED))}"
    assert HELPERS <= users
    # the runtime paths themselves reach PGMQ only through the helpers
    for name in ("complete_task", "fail_task", "start_tasks", "requeue_stalled_tasks", "_fail_run",
                 "_skip_step", "_cascade_force_skip_steps", "cascade_resolve_conditions"):
        src = next(f["prosrc"] for f in functions if f["proname"] == name)
        assert "pgmq." not in src, name


def test_replacing_the_helpers_redirects_every_path(rt, db):
    """Wrap both helpers (as the queue-identity migration replaces them) and drive every path."""
    rt.conn.execute(
        """
        CREATE TABLE public.helper_calls (id bigserial, helper text, step_slugs text[], offsets integer[]);
        ALTER FUNCTION pgflow._archive_task_messages(uuid[], text[], integer[]) RENAME TO _archive_original;
        ALTER FUNCTION pgflow._set_task_messages_vt(uuid[], text[], integer[], integer[]) RENAME TO _vt_original;
        CREATE FUNCTION pgflow._archive_task_messages(a uuid[], b text[], c integer[]) RETURNS integer
        LANGUAGE plpgsql SET search_path = '' AS $$
        BEGIN
          INSERT INTO public.helper_calls (helper, step_slugs) VALUES ('archive', b);
          RETURN pgflow._archive_original(a, b, c);
        END $$;
        CREATE FUNCTION pgflow._set_task_messages_vt(a uuid[], b text[], c integer[], d integer[]) RETURNS integer
        LANGUAGE plpgsql SET search_path = '' AS $$
        BEGIN
          INSERT INTO public.helper_calls (helper, step_slugs, offsets) VALUES ('vt', b, d);
          RETURN pgflow._vt_original(a, b, c, d);
        END $$;
        """
    )

    def calls():
        rows = rt.rows("SELECT helper, step_slugs, offsets FROM public.helper_calls ORDER BY id")
        rt.conn.execute("TRUNCATE public.helper_calls")
        return [(r["helper"], r["step_slugs"], r["offsets"]) for r in rows if r["step_slugs"]]

    rt.flow("wrapped", [
        {"slug": "a", "timeout": 4},
        {"slug": "b", "deps": ["a"], "max_attempts": 2, "base_delay": 3},
        {"slug": "m", "deps": ["a"], "step_type": "map", "when_exhausted": "skip", "max_attempts": 1},
        {"slug": "c", "deps": ["b"], "timeout": 1},
    ])
    run = rt.start("wrapped", {})
    rt.poll("wrapped")
    assert calls() == [("vt", ["a"], [6])]  # claim: timeout 4 + 2

    rt.complete(run, "a", 0, [1, 2])
    assert calls() == [("archive", ["a"], None)]

    rt.poll("wrapped")
    calls()
    rt.fail(run, "b", 0, "retry me")
    assert calls() == [("vt", ["b"], [6])]  # retry: 3 * 2^1

    rt.fail(run, "m", 0, "skip the map")
    # the failed task's message, then its started sibling's (now skipped)
    assert calls() == [("archive", ["m"], None), ("archive", ["m"], None)]
    assert [t["status"] for t in rt.tasks(run, "m")] == ["failed", "skipped"]

    rt.make_visible("wrapped")
    rt.poll("wrapped")
    calls()
    rt.complete(run, "b", 0, "B")
    rt.poll("wrapped")
    calls()
    rt.conn.execute(
        "UPDATE pgflow.step_tasks SET started_at = now() - interval '40 s', queued_at = now() - interval '40 s' "
        "WHERE run_id = %s AND step_slug = 'c'",
        (run,),
    )
    assert rt.val("SELECT pgflow.requeue_stalled_tasks()") == 1
    assert calls() == [("vt", ["c"], [0])]

    rt.poll("wrapped")
    calls()
    rt.complete(run, "c", 0, "C")
    assert calls() == [("archive", ["c"], None)]
    assert rt.run(run)["status"] == "completed"

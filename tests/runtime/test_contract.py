"""The queue-helper contract of docs/architecture.md, checked against the installed functions.

Every message mutation after the initial send (start_ready_steps) goes through
_archive_task_messages / _set_task_messages_vt, so the queue-identity migration can replace
just those two. The 0002 contract test is baseline-only (it names the 0002 function set); the
upgraded level has its own, stricter one: each function's exact set of PGMQ operations, and
helpers that group by the task's queue snapshot.
"""

from __future__ import annotations

import re

import pytest

from pgflow_cli import sqlfiles

HELPERS = {"_archive_task_messages", "_set_task_messages_vt"}
# pgflow functions allowed to name PGMQ message operations directly, and why.
ALLOWED = {
    "_archive_task_messages": "the archive helper",
    "_set_task_messages_vt": "the visibility helper",
    "set_vt_batch": "upstream-compatible utility on an explicit queue name; the runtime never calls it",
    "start_ready_steps": "the initial send (pgmq.send_batch)",
    "_start_ready_steps_of_runs": "the initial send for several runs at once (complete_tasks' set-based pass, 0014)",
    "create_flow": "creates the flow's queue",
    "_create_private_queue": "creates one private step queue of a step-queued flow being provisioned",
    "delete_flow_and_data": "drops the flow's queue",
    "prune_data_older_than": "deletes old rows of archive tables (optional file)",
}
MESSAGE_OPS = re.compile(
    r"pgmq\.(archive|delete|set_vt|send|send_batch|pop|purge_queue|create|drop_queue)\s*\(|UPDATE\s+pgmq\.|DELETE\s+FROM\s+pgmq\.",
    re.IGNORECASE,
)


@pytest.mark.baseline_only(
    reason="the 0002 helper contract (start_tasks reaches PGMQ through the helpers); 0003 has its own "
    "contract: test_upgraded_runtime_reaches_pgmq_only_through_the_helpers_and_documented_exceptions"
)
def test_only_the_helpers_touch_existing_messages(rt):
    rt.conn.execute(sqlfiles.load(rt.prune_file))
    functions = rt.rows(
        "SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'pgflow'"
    )
    users = {f["proname"] for f in functions if MESSAGE_OPS.search(f["prosrc"])}
    assert users - set(ALLOWED) == set(), f"functions touching PGMQ directly: {sorted(users - set(ALLOWED))}"
    assert users >= HELPERS
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


# -- the upgraded (0003) contract ---------------------------------------------------------------

# PGMQ operations, by kind, as they appear in function bodies (static calls and dynamic SQL).
PGMQ_OPERATIONS = {
    "archive": re.compile(r"pgmq\.archive\s*\(", re.I),
    "delete_message": re.compile(r"pgmq\.delete\s*\(", re.I),
    "set_vt": re.compile(r"pgmq\.set_vt\s*\(", re.I),
    "send": re.compile(r"pgmq\.send\s*\(", re.I),
    "send_batch": re.compile(r"pgmq\.send_batch\s*\(", re.I),
    "pop": re.compile(r"pgmq\.pop\s*\(", re.I),
    "purge_queue": re.compile(r"pgmq\.purge_queue\s*\(", re.I),
    "read": re.compile(r"pgmq\.read(_with_poll)?\s*\(", re.I),
    "create": re.compile(r"pgmq\.create\w*\s*\(", re.I),
    "drop_queue": re.compile(r"pgmq\.drop_queue\s*\(", re.I),
    "update_rows": re.compile(r"UPDATE\s+pgmq\.", re.I),
    "delete_rows": re.compile(r"DELETE\s+FROM\s+pgmq\.(?!meta\b)", re.I),
    "select_rows": re.compile(r"SELECT\b[^;]*?\bFROM\s+pgmq\.%I", re.I),
    "drop_table": re.compile(r"DROP\s+TABLE[^;]*pgmq\.", re.I),
    "delete_meta": re.compile(r"DELETE\s+FROM\s+pgmq\.meta\b", re.I),
}

# Every pgflow function of the upgraded schema that may operate on PGMQ queues or messages, with
# exactly the operations it may use (docs/architecture.md; spec "Queue identity").
UPGRADED_ALLOWED = {
    "_archive_task_messages": {"archive"},  # the archive helper
    "_set_task_messages_vt": {"update_rows"},  # the visibility helper
    "start_ready_steps": {"send_batch"},  # the initial send, to steps.queue_name
    "_start_ready_steps_of_runs": {"send_batch"},  # the same initial send for several runs (0014)
    # claim_tasks: reads the batch it classifies, archives clearly foreign messages (no task to
    # go through a helper), and on a fatal batch makes the whole batch visible again
    "claim_tasks": {"select_rows", "archive", "update_rows"},
    "create_flow": {"create"},  # the flow's default queue
    "_create_private_queue": {"create"},  # one private step queue of a flow being provisioned (0005)
    "delete_flow_and_data": {"drop_queue", "drop_table", "delete_meta"},  # drops the flow's queues
    # whole-flow deletion (0008): counts what goes, drops each queue whole by its listed spelling,
    # and removes what is left of a queue whose table was already gone (archive table, meta row)
    "drop_flow": {"select_rows", "drop_queue", "drop_table", "delete_meta"},
    "drop_flow_plan": {"select_rows"},  # counts queued and archived messages for the plan
    "set_vt_batch": {"update_rows"},  # compatibility utility on an explicit queue; the runtime never calls it
    "prune_data_older_than": {"delete_rows"},  # old rows of archive tables (optional file)
    # pgflow prune: counts and deletes archive rows older than the cutoff, in batches (PGMQ has no
    # function that deletes archived messages by age); never a queue table
    "prune_archive": {"select_rows", "delete_rows"},
}

RUNTIME_PATHS = (
    "complete_task", "fail_task", "start_tasks", "requeue_stalled_tasks", "_fail_run", "_skip_step",
    "_cascade_force_skip_steps", "cascade_resolve_conditions", "cascade_complete_taskless_steps",
    "maybe_complete_run", "start_flow", "_advance_run", "ensure_flow_compiled", "_create_flow_from_shape",
    "add_step", "register_worker",
)


def _code_only(src: str) -> str:
    """A PL/pgSQL body without comments and RAISE statements (messages and hints name PGMQ calls as advice)."""
    out: list[str] = []
    i, n = 0, len(src)
    while i < n:
        if src.startswith("--", i):
            i = src.find("\n", i)
            i = n if i < 0 else i
            continue
        if re.match(r"RAISE\b", src[i:i + 6], re.I) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            quoted = False
            while i < n and (quoted or src[i] != ";"):
                if src[i] == "'":
                    quoted = not quoted
                i += 1
            i += 1
            continue
        out.append(src[i])
        i += 1
    return "".join(out)


def _pgmq_operations(src: str) -> set[str]:
    code = _code_only(src)
    return {kind for kind, pattern in PGMQ_OPERATIONS.items() if pattern.search(code)}


@pytest.mark.upgraded_only(reason="the 0003 queue-helper contract")
def test_upgraded_runtime_reaches_pgmq_only_through_the_helpers_and_documented_exceptions(rt):
    rt.conn.execute(sqlfiles.load(rt.prune_file))
    functions = {
        f["proname"]: f["prosrc"]
        for f in rt.rows(
            "SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'pgflow' AND p.prokind = 'f'"
        )
    }
    used = {name: ops for name, src in functions.items() if (ops := _pgmq_operations(src))}
    assert used == UPGRADED_ALLOWED

    # the runtime paths reach PGMQ only through the helpers (no pgmq. in their code at all)
    for name in RUNTIME_PATHS:
        assert "pgmq." not in _code_only(functions[name]), name

    # claim_tasks archives directly only the clearly foreign messages, in the queue it was given
    claim = _code_only(functions["claim_tasks"])
    assert re.findall(r"pgmq\.archive\s*\(([^)]*)\)", claim) == ["claim_tasks.queue_name, v_foreign"]
    # ... its one direct visibility change is the fatal release, inside the fatal branch
    fatal_branch = claim[claim.index("IF v_fatal > 0 THEN"):claim.index("RETURN;", claim.index("IF v_fatal > 0 THEN"))]
    assert len(re.findall(r"UPDATE\s+pgmq\.", claim, re.I)) == 1
    assert re.search(r"UPDATE\s+pgmq\.%I AS q SET vt = pg_catalog\.clock_timestamp\(\)", fatal_branch)
    # ... and everything else goes through the helpers
    assert "pgflow._set_task_messages_vt(" in claim and "pgflow._archive_task_messages(" in claim

    # the helpers group the tasks by their queue snapshot, never by the flow slug
    for helper in HELPERS:
        code = _code_only(functions[helper])
        assert re.search(r"GROUP BY t\.queue_name", code), helper
        assert "flow_slug" not in code, helper
    # start_ready_steps sends to the step's persisted route and snapshots that same name on the task
    send = _code_only(functions["start_ready_steps"])
    assert re.search(r"s\.queue_name(, s\.execution_mode)?\s+INTO v_tasks, v_delay, v_queue", send)
    assert re.search(r"pgmq\.send_batch\(\s*v_queue", send)
    assert re.search(r"v_step, \(m\.n - 1\)::integer, v_queue, m\.msg_id", send)
    # ... and so does its form for several runs (0014): one route for all of them, or nothing sent
    several = _code_only(functions["_start_ready_steps_of_runs"])
    assert re.search(r"pg_catalog\.min\(s\.queue_name\)", several)
    assert re.search(r"pgmq\.send_batch\(\s*v_queue", several)
    assert re.search(r"t\.task_index::integer, v_queue, m\.msg_id", several)

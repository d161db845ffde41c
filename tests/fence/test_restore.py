"""fence restore: exactly the recorded values, compare-and-set, conflicts left alone (exit 6),
a fatal pause never lifted, and exit 6 when nothing is recorded."""

from __future__ import annotations

import json
import uuid

from psycopg.types.json import Jsonb


def _functions(fenv, *names: str) -> None:
    for name in names:
        fenv.conn.execute("SELECT pgflow.track_worker_function(%s)", (name,))


def _fence(fenv, *names: str, reason: str = "deploy") -> None:
    args = [a for name in names for a in ("--function", name)]
    result = fenv.cli("disable", *args, "-m", reason, "--detach")
    assert result.code == 0, result.output


def _fences(fenv) -> list[tuple]:
    return [(r["function_name"], r["state"], r["previous_enabled"]) for r in
            fenv.rows("SELECT function_name, state, previous_enabled FROM pgflow.fences ORDER BY fence_id")]


def test_restore_after_an_out_of_band_change_is_a_conflict_and_leaves_that_row_alone(fenv):
    _functions(fenv, "a-fn", "b-fn", "c-fn")
    _fence(fenv, "a-fn", "b-fn", "c-fn")
    # someone enables b by hand and disables it again: same value, but changed since the fence
    fenv.conn.execute("UPDATE pgflow.worker_functions SET enabled = true WHERE function_name = 'b-fn'")
    fenv.conn.execute("UPDATE pgflow.worker_functions SET enabled = false WHERE function_name = 'b-fn'")
    # and someone enables c and leaves it enabled
    fenv.conn.execute("UPDATE pgflow.worker_functions SET enabled = true WHERE function_name = 'c-fn'")
    before = fenv.rows("SELECT * FROM pgflow.worker_functions WHERE function_name IN ('b-fn', 'c-fn') ORDER BY 1")

    status = json.loads(fenv.cli("status", "--format", "json").stdout)
    assert {f["function_name"]: f["holds"] for f in status["fences"]} == {"a-fn": True, "b-fn": False, "c-fn": False}

    result = fenv.cli("restore", "--all", "--format", "json")
    assert result.code == 6, result.output
    outcome = {f["function_name"]: (f["action"], f["detail"]) for f in json.loads(result.stdout)["functions"]}
    assert outcome["a-fn"] == ("restored", None)
    assert outcome["b-fn"] == ("conflict", "enabled was changed since the fence (now false, 2 change(s) of value)")
    assert outcome["c-fn"] == ("conflict", "enabled was changed since the fence (now true, 1 change(s) of value)")
    error = json.loads(result.stderr)
    assert error["exit_code"] == 6 and error["detail"] == [f"{n}: {outcome[n][1]}" for n in ("b-fn", "c-fn")]

    assert fenv.enabled("a-fn") is True
    assert fenv.rows("SELECT * FROM pgflow.worker_functions WHERE function_name IN ('b-fn', 'c-fn') ORDER BY 1") == before
    assert _fences(fenv) == [("a-fn", "restored", True), ("b-fn", "conflict", True), ("c-fn", "conflict", True)]
    # every fence is closed: there is nothing left to restore
    again = fenv.cli("restore", "--all")
    assert again.code == 6 and "no active fence is recorded" in again.stderr


def test_a_function_disabled_before_the_fence_stays_disabled(fenv):
    _functions(fenv, "on-fn", "off-fn")
    fenv.conn.execute("UPDATE pgflow.worker_functions SET enabled = false WHERE function_name = 'off-fn'")
    _fence(fenv, "on-fn", "off-fn")
    result = fenv.cli("restore", "--function", "on-fn", "--function", "off-fn")
    assert result.code == 0, result.output
    assert "kept_disabled" in result.stdout
    assert (fenv.enabled("on-fn"), fenv.enabled("off-fn")) == (True, False)
    assert _fences(fenv) == [("off-fn", "restored", False), ("on-fn", "restored", True)]


def test_a_fatal_pause_during_the_fence_is_never_lifted(fenv):
    fenv.conn.execute("SELECT pgflow.create_flow('pay')")
    fenv.conn.execute("SELECT pgflow.add_step('pay', 'charge')")
    worker = uuid.uuid4()
    fenv.conn.execute("SELECT pgflow.register_worker(%s, 'pay-worker', 'pay', 'pay')", (worker,))
    _fence(fenv, "pay-worker")
    # the deprecated worker, still draining, reads a message that looks like pgflow work without a task
    msg = fenv.val("SELECT * FROM pgmq.send('pay', %s)", (Jsonb({"flow_slug": "pay", "run_id": str(uuid.uuid4()),
                                                                "step_slug": "charge", "task_index": 0}),))
    outcome = fenv.val("SELECT outcome FROM pgflow.claim_tasks('pay', ARRAY[%s]::bigint[], %s, 'pay', NULL)", (msg, worker))
    assert outcome == "fatal"
    paused = fenv.val("SELECT paused_reason FROM pgflow.worker_functions WHERE function_name = 'pay-worker'")
    assert "task_missing" in paused

    status = json.loads(fenv.cli("status", "--format", "json").stdout)
    assert status["fences"][0]["restore_outlook"] == "conflict: a fatal claim paused the function"
    result = fenv.cli("restore", "--function", "pay-worker")
    assert result.code == 6
    assert "a fatal claim paused the function during the fence" in result.stdout + result.stderr
    row = fenv.rows("SELECT enabled, paused_reason FROM pgflow.worker_functions WHERE function_name = 'pay-worker'")
    assert row == [{"enabled": False, "paused_reason": paused}]
    assert _fences(fenv) == [("pay-worker", "conflict", True)]


def test_a_deleted_and_recreated_function_row_is_a_conflict(fenv):
    _functions(fenv, "gone-fn")
    _fence(fenv, "gone-fn")
    fenv.conn.execute("DELETE FROM pgflow.worker_functions WHERE function_name = 'gone-fn'")
    fenv.conn.execute("INSERT INTO pgflow.worker_functions (function_name, enabled, created_at) "
                      "VALUES ('gone-fn', false, now() + interval '1 second')")
    result = fenv.cli("restore", "--function", "gone-fn")
    assert result.code == 6 and "deleted and created again since the fence" in result.stdout
    assert fenv.enabled("gone-fn") is False


def test_restore_without_a_recorded_fence_changes_nothing_and_exits_6(fenv):
    _functions(fenv, "plain-fn", "fenced-fn")
    _fence(fenv, "fenced-fn")
    result = fenv.cli("restore", "--function", "plain-fn", "--function", "fenced-fn")
    assert result.code == 6
    assert "no recorded fence for plain-fn: nothing was restored" in result.stderr
    assert fenv.enabled("fenced-fn") is False and _fences(fenv) == [("fenced-fn", "active", True)]

    dry = fenv.cli("restore", "--function", "fenced-fn", "--dry-run", "--format", "json")
    assert dry.code == 0 and json.loads(dry.stdout)["functions"][0]["action"] == "restored"
    assert fenv.enabled("fenced-fn") is False and _fences(fenv) == [("fenced-fn", "active", True)]

    assert fenv.cli("restore", "--function", "fenced-fn").code == 0
    assert fenv.cli("restore", "--function", "fenced-fn").code == 6
    assert fenv.cli("restore").code == 2  # nothing named: a usage error

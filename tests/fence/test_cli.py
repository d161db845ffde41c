"""The fence commands' options, outputs and exit codes without worker processes."""

from __future__ import annotations

import json
import re

from tests.fence.helpers import wait_until
from tests.support.cli import run_cli


def _functions(fenv, *names: str) -> None:
    for name in names:
        fenv.conn.execute("SELECT pgflow.track_worker_function(%s)", (name,))


def test_disable_records_the_fence_durably_with_reason_who_and_when(fenv):
    _functions(fenv, "mail-fn")
    result = fenv.cli("disable", "--function", "mail-fn", "-m", "  mail v3 (ticket 81)  ", "--format", "json")
    assert result.code == 0, result.output
    document = json.loads(result.stdout)
    assert document["outcome"] == "drained" and document["drain"]["state"] == "drained"
    [fence] = fenv.rows("SELECT * FROM pgflow.fences")
    assert (fence["function_name"], fence["previous_enabled"], fence["written_enabled"], fence["reason"],
            fence["state"], fence["fenced_by"], fence["fenced_client"]) == (
        "mail-fn", True, False, "mail v3 (ticket 81)", "active", "postgres", "local")
    assert fence["fenced_application"].startswith("pgflow fence (") and "@" in fence["fenced_application"]
    assert fenv.enabled("mail-fn") is False


def test_disable_again_on_the_same_set_changes_nothing(fenv):
    _functions(fenv, "x-fn", "y-fn")
    assert fenv.cli("disable", "--function", "x-fn", "--function", "y-fn", "-m", "first").code == 0
    before = fenv.rows("SELECT * FROM pgflow.fences ORDER BY fence_id")
    rows_before = fenv.rows("SELECT * FROM pgflow.worker_functions ORDER BY function_name")
    again = fenv.cli("disable", "--function", "y-fn", "--function", "x-fn", "--function", "x-fn", "-m", "second")
    assert again.code == 0, again.output
    assert again.stdout.count("already_fenced") == 2 and "its record is unchanged" in again.stdout
    assert fenv.rows("SELECT * FROM pgflow.fences ORDER BY fence_id") == before
    assert fenv.rows("SELECT * FROM pgflow.worker_functions ORDER BY function_name") == rows_before
    # an overlapping set fences only what is new
    _functions(fenv, "z-fn")
    assert fenv.cli("disable", "--function", "x-fn", "--function", "z-fn", "-m", "third").code == 0
    assert [(r["function_name"], r["reason"]) for r in fenv.rows("SELECT * FROM pgflow.fences ORDER BY fence_id")] == [
        ("x-fn", "first"), ("y-fn", "first"), ("z-fn", "third")]


def test_disable_dry_run_shows_the_rows_and_changes_nothing(fenv):
    _functions(fenv, "dry-fn")
    result = fenv.cli("disable", "--function", "dry-fn", "-m", "try", "--dry-run")
    assert result.code == 0, result.output
    assert "dry run: would fence 1 worker function(s)" in result.stdout and "would fence" in result.stdout
    assert fenv.enabled("dry-fn") is True
    assert fenv.val("SELECT count(*) FROM pgflow.fences") == 0


def test_refusals_change_nothing_and_have_their_exit_codes(fenv):
    _functions(fenv, "real-fn")
    unknown = fenv.cli("disable", "--function", "real-fn", "--function", "typo-fn", "-m", "deploy")
    assert unknown.code == 6 and "typo-fn: no such worker function" in unknown.stderr
    assert fenv.enabled("real-fn") is True and fenv.val("SELECT count(*) FROM pgflow.fences") == 0

    no_flow = fenv.cli("disable", "--flow", "nosuchflow", "-m", "deploy")
    assert no_flow.code == 6 and "flow not found: 'nosuchflow'" in no_flow.stderr
    fenv.conn.execute("SELECT pgflow.create_flow('idle')")
    unserved = fenv.cli("disable", "--flow", "idle", "-m", "deploy")
    assert unserved.code == 6 and "no worker has registered for flow(s) idle" in unserved.stderr

    no_reason = fenv.cli("disable", "--function", "real-fn")
    assert no_reason.code == 2 and "-m REASON is required" in no_reason.stderr
    too_long = fenv.cli("disable", "--function", "real-fn", "-m", "x" * 1001)
    assert too_long.code == 2
    nothing = fenv.cli("disable", "-m", "deploy", "--format", "json")
    assert nothing.code == 2 and json.loads(nothing.stderr)["exit_code"] == 2
    assert fenv.cli("restore", "--all", "--function", "real-fn").code == 2
    assert fenv.val("SELECT count(*) FROM pgflow.fences") == 0


def test_a_stale_fence_refuses_a_new_disable_until_it_is_closed(fenv):
    _functions(fenv, "s-fn")
    assert fenv.cli("disable", "--function", "s-fn", "-m", "one", "--detach").code == 0
    fenv.conn.execute("UPDATE pgflow.worker_functions SET enabled = true WHERE function_name = 's-fn'")
    stale = fenv.cli("disable", "--function", "s-fn", "-m", "two")
    assert stale.code == 6 and "no longer holds" in stale.stderr
    assert re.search(r"pgflow fence restore --dsn '[^']*' --function s-fn", stale.stderr)  # the target repeated
    assert fenv.enabled("s-fn") is True
    assert fenv.cli("restore", "--function", "s-fn").code == 6  # closes it as a conflict, row untouched
    assert fenv.enabled("s-fn") is True
    assert fenv.cli("disable", "--function", "s-fn", "-m", "two", "--detach").code == 0
    assert [r["state"] for r in fenv.rows("SELECT state FROM pgflow.fences ORDER BY fence_id")] == ["conflict", "active"]


def test_status_lists_active_fences_with_age_reason_and_outlook(fenv):
    assert "no active fence" in fenv.cli("status").stdout
    _functions(fenv, "p-fn", "q-fn")
    fenv.conn.execute("UPDATE pgflow.worker_functions SET enabled = false WHERE function_name = 'q-fn'")
    assert fenv.cli("disable", "--function", "p-fn", "--function", "q-fn", "-m", "nightly\x1b[2J deploy", "--detach").code == 0
    table = fenv.cli("status")
    assert table.code == 0
    assert "2 active fence(s)" in table.stdout and "enable again" in table.stdout
    assert "keep disabled (was disabled before)" in table.stdout
    assert "nightly\\e[2J deploy" in table.stdout and "\x1b[2J" not in table.stdout  # control characters escaped
    document = json.loads(fenv.cli("status", "--function", "q-fn", "--format", "json").stdout)
    assert [(f["function_name"], f["previous_enabled"], f["holds"]) for f in document["fences"]] == [("q-fn", False, True)]
    assert document["drain"]["state"] == "drained"


def test_a_database_without_the_fence_record_is_exit_3(baseline_db):
    result = run_cli("fence", "status", "--dsn", baseline_db.conninfo)
    assert result.code == 3
    assert "rollout-fence record" in result.stderr and "docs/upgrade.md step 2" in result.stderr
    assert "pgflow migrate apply" in result.stderr


def test_disable_all_fences_every_worker_function_and_restore_all_lifts_them(fenv):
    _functions(fenv, "one-fn", "two-fn")
    fenv.conn.execute("UPDATE pgflow.worker_functions SET enabled = false WHERE function_name = 'two-fn'")
    result = fenv.cli("disable", "--all", "-m", "upgrade", "--format", "json")
    assert result.code == 0, result.output
    assert [f["function_name"] for f in json.loads(result.stdout)["functions"]] == ["one-fn", "two-fn"]
    assert fenv.cli("disable", "--all", "--function", "one-fn", "-m", "x").code == 2
    assert fenv.cli("restore", "--all").code == 0
    assert (fenv.enabled("one-fn"), fenv.enabled("two-fn")) == (True, False)


def test_status_watch_refreshes_until_ctrl_c(fenv):
    _functions(fenv, "w-fn")
    assert fenv.cli("disable", "--function", "w-fn", "-m", "watch me", "--detach").code == 0
    watch = fenv.cli_background("status", "--watch", "--interval", "0.1", "--format", "json")
    wait_until(lambda: len(watch.out) >= 3, "three status documents")
    watch.interrupt()
    result = watch.finish()
    assert result.code == 130 and "stopped watching; nothing was changed" in result.stderr
    documents = [json.loads(line) for line in result.stdout.splitlines()]
    assert all(d["fences"][0]["reason"] == "watch me" for d in documents)
    assert fenv.enabled("w-fn") is False


def test_an_upgraded_database_gets_the_fence_and_keeps_every_function_row(baseline_db):
    conn = baseline_db.connect()
    conn.execute("SELECT pgflow.track_worker_function('old-on'), pgflow.track_worker_function('old-off')")
    conn.execute("UPDATE pgflow.worker_functions SET enabled = false WHERE function_name = 'old-off'")
    before = conn.execute("SELECT function_name, enabled, created_at FROM pgflow.worker_functions ORDER BY 1").fetchall()
    assert run_cli("migrate", "apply", "--dsn", baseline_db.conninfo).code == 0
    after = conn.execute("SELECT function_name, enabled, created_at, enabled_changes FROM pgflow.worker_functions "
                         "ORDER BY 1").fetchall()
    assert after == [row + (0,) for row in before]
    fenced = run_cli("fence", "disable", "--all", "-m", "first rollout", "--dsn", baseline_db.conninfo)
    assert fenced.code == 0, fenced.output
    assert run_cli("fence", "restore", "--all", "--dsn", baseline_db.conninfo).code == 0
    assert conn.execute("SELECT function_name, enabled FROM pgflow.worker_functions ORDER BY 1").fetchall() == [
        ("old-off", False), ("old-on", True)]

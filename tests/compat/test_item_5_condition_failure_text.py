"""Item 5: the text of a failed condition (when_unmet = fail) is released pgflow's on the current
level, ours on the baseline.

docs/compatibility.md item 5. Released pgflow stores exactly "Condition not met" on the failed step
(its own tests pin it); the current level stores the same, the baseline keeps its longer text
(migration 0002 is frozen). Pinned exactly: on the step state and in the step:failed and run:failed
broadcasts.
"""

from __future__ import annotations

from tests.compat.conftest import FAKE_REALTIME

RELEASED = "Condition not met"
BASELINE = 'Condition not met for step "check" (when_unmet = fail)'


def test_item_5_condition_failure_text(rt):
    rt.conn.execute(FAKE_REALTIME)
    rt.flow("condFail", [
        {"slug": "first"},
        {"slug": "check", "deps": ["first"], "required_input_pattern": {"first": {"ok": True}}, "when_unmet": "fail"},
    ])
    run = rt.start("condFail", {})
    [task] = rt.poll("condFail")
    rt.complete(run, task["step_slug"], task["task_index"], {"ok": False})

    assert rt.run(run)["status"] == "failed"
    expected = BASELINE if rt.level == "baseline" else RELEASED
    check = rt.steps(run)["check"]
    assert check["status"] == "failed"
    assert check["error_message"] == expected

    events = {
        r["event"]: r["payload"]
        for r in rt.rows("SELECT event, payload FROM realtime.sent WHERE topic = %s", (f"pgflow:run:{run}",))
    }
    assert events["step:check:failed"]["error_message"] == expected
    assert events["run:failed"]["error_message"] == expected

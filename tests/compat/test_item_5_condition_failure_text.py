"""Item 5: the text of a failed condition (when_unmet = fail) is ours, kept stable.

docs/compatibility.md item 5. The facts we work from give the released text only as the
phrase "Condition not met", not its exact wording, so ours starts with that phrase and is
pinned here exactly: on the step state and in the step:failed and run:failed broadcasts.
"""

from __future__ import annotations

from tests.compat.conftest import FAKE_REALTIME

RELEASED_PHRASE = "Condition not met"
OURS = 'Condition not met for step "check" (when_unmet = fail)'


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
    check = rt.steps(run)["check"]
    assert check["status"] == "failed"
    assert check["error_message"] == OURS
    assert check["error_message"].startswith(RELEASED_PHRASE)

    events = {
        r["event"]: r["payload"]
        for r in rt.rows("SELECT event, payload FROM realtime.sent WHERE topic = %s", (f"pgflow:run:{run}",))
    }
    assert events["step:check:failed"]["error_message"] == OURS
    assert events["run:failed"]["error_message"] == OURS

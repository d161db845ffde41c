"""Item 4: a [TYPE_VIOLATION] failure keeps the offending output on the failed task, as released.

docs/compatibility.md item 4. The step state's output stays NULL (only completed steps have
one: constraint item 8); the task row keeps what the handler returned, for diagnosis.
"""

from __future__ import annotations

BAD_OUTPUT = {"not": "an array", "rows": [1, 2]}


def _violate(rt):
    rt.flow("typeViolation", [
        {"slug": "produce"},
        {"slug": "each", "deps": ["produce"], "step_type": "map"},
    ])
    run = rt.start("typeViolation", {})
    [task] = rt.poll("typeViolation")
    rt.complete(run, task["step_slug"], task["task_index"], BAD_OUTPUT)
    assert rt.run(run)["status"] == "failed"
    failed = rt.task(run, "produce")
    assert failed["status"] == "failed"
    assert failed["error_message"].startswith("[TYPE_VIOLATION]")
    assert rt.steps(run)["produce"]["output"] is None
    return failed


def test_item_4_type_violation_stores_the_offending_output(old, new):
    assert _violate(old)["output"] is None
    assert _violate(new)["output"] == BAD_OUTPUT

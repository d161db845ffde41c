"""Item 7: no fixed cascade limit; a cascade is bounded by the flow's step count instead.

docs/compatibility.md item 7. Released pgflow stops its two cascade loops with an error after
50 passes; ours keeps going while a pass changes something. Every pass turns at least one
created step terminal (otherwise the loop ends), so one call makes at most (steps + 1)
passes. Pinned on both levels with chains far beyond 50: one taskless cascade (empty maps)
and one condition cascade (each step skipped because its condition is unmet).
"""

from __future__ import annotations

import pytest

CHAIN = 120
"""Steps in each chain: well past the released limit of 50 passes."""


def _chain(rt, slug: str, **step_options) -> list[str]:
    names = [f"s{i:03d}" for i in range(CHAIN)]
    rt.flow(slug, [
        {"slug": name, "deps": [names[i - 1]] if i else [], **step_options} for i, name in enumerate(names)
    ])
    return names


@pytest.mark.parametrize("kind", ["empty_maps", "unmet_conditions"])
def test_item_7_cascades_have_no_fixed_pass_limit(rt, kind):
    if kind == "empty_maps":
        names = _chain(rt, "chainMaps", step_type="map")
        run = rt.start("chainMaps", [])  # the root map has nothing to do, so every map below neither
        expected = {"status": "completed", "skip_reason": None}
        output = {names[-1]: []}
    else:
        names = _chain(rt, "chainConds", required_input_pattern={"never": True}, when_unmet="skip")
        run = rt.start("chainConds", {})
        expected = {"status": "skipped", "skip_reason": "condition_unmet"}
        output = {}

    # everything happened inside start_flow: no task was ever created
    assert rt.val("SELECT count(*) FROM pgflow.step_tasks WHERE run_id = %s", (run,)) == 0
    states = rt.steps(run)
    assert len(states) == CHAIN
    assert {(s["status"], s["skip_reason"]) for s in states.values()} == {(expected["status"], expected["skip_reason"])}
    finished = rt.run(run)
    assert (finished["status"], finished["remaining_steps"], finished["output"]) == ("completed", 0, output)

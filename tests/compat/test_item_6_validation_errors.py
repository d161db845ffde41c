"""Item 6: definition and input validation raise our PF/22xxx SQLSTATEs, not the released ones.

docs/compatibility.md item 6 (the mapping table). Released pgflow lets table constraints
(23514, 23503, 23502) or a plain RAISE (P0001) report these; ours checks first and raises one
documented class with a message naming the flow, the step and the value. Pinned on both
levels: SQLSTATE and message. Direct table writes still hit the table constraints (23514),
as in the released schema.
"""

from __future__ import annotations

import pytest

from tests.runtime.driver import raises_sqlstate

# (item, released SQLSTATE (derived, see the doc), ours, call, message pattern)
CASES = [
    ("flow_slug", "23514", "PF003", "SELECT pgflow.create_flow('1bad')", r"^invalid flow slug '1bad': "),
    ("flow_slug_too_long", "P0001", "PF003", "SELECT pgflow.create_flow(repeat('a', 48))",
     r"^flow slug \"a{48}\" is 48 characters long; its (PGMQ )?queue name may have at most 47$"),
    ("flow_options", "23514", "PF003", "SELECT pgflow.create_flow('f2', max_attempts => -1)",
     r"^invalid options for flow \"f2\": max_attempts and base_delay must be >= 0, timeout > 0$"),
    ("step_slug", "23514", "PF003", "SELECT pgflow.add_step('f', 'run')", r"^invalid step slug 'run' in flow \"f\": "),
    ("flow_unknown_in_add_step", "23503", "PF003", "SELECT pgflow.add_step('nope', 'a')",
     r"^cannot add step \"a\": flow \"nope\" does not exist$"),
    ("dependency_unknown", "23503", "PF003", "SELECT pgflow.add_step('f', 'b', ARRAY['zzz'])",
     r"^step \"b\" of flow \"f\" depends on unknown step\(s\): zzz$"),
    ("dependency_on_itself", "23514", "PF003", "SELECT pgflow.add_step('f', 'b', ARRAY['b'])",
     r"^step \"b\" of flow \"f\" cannot depend on NULL or on itself$"),
    ("when_unmet", "23514", "PF003", "SELECT pgflow.add_step('f', 'b', when_unmet => 'ignore')",
     r"^step \"b\" of flow \"f\": when_unmet and when_exhausted must be fail, skip or skip-cascade$"),
    ("when_exhausted", "23514", "PF003", "SELECT pgflow.add_step('f', 'b', when_exhausted => 'ignore')",
     r"^step \"b\" of flow \"f\": when_unmet and when_exhausted must be fail, skip or skip-cascade$"),
    ("input_pattern", "23514", "PF003", "SELECT pgflow.add_step('f', 'b', required_input_pattern => '[1]')",
     r"^step \"b\" of flow \"f\": input patterns must be JSON objects$"),
    ("start_delay", "23514", "PF003", "SELECT pgflow.add_step('f', 'b', start_delay => -1)",
     r"^step \"b\" of flow \"f\": max_attempts, base_delay and start_delay must be >= 0, timeout > 0$"),
    ("step_type", "23514", "PF003", "SELECT pgflow.add_step('f', 'b', step_type => 'loop')",
     r"^step \"b\" of flow \"f\": step_type must be 'single' or 'map', not 'loop'$"),
    ("map_dependencies", "P0001", "PF003", "SELECT pgflow.add_step('f', 'm', ARRAY['a', 'a2'], step_type => 'map')",
     r"^map step \"m\" of flow \"f\" has 2 dependencies; a map step takes at most one$"),
    ("root_map_input", "P0001", "22023", "SELECT pgflow.start_flow('fm', '{}')",
     r"^flow \"fm\" has a root map step, so its input must be a JSON array \(got object\)$"),
    ("run_input_null", "23502", "22004", "SELECT pgflow.start_flow('f', NULL)",
     r"^flow \"f\": the run input must not be NULL \(use '\{\}' for no input\)$"),
    ("flow_unknown_in_start_flow", "23503", "PF006", "SELECT pgflow.start_flow('nope', '{}')",
     r"^flow \"nope\" does not exist$"),
    ("set_vt_batch_lengths", "P0001", "22023", "SELECT * FROM pgflow.set_vt_batch('f', ARRAY[1, 2]::bigint[], ARRAY[1])",
     r"^set_vt_batch\(\): msg_ids has 2 elements but vt_offsets has 1$"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_item_6_validation_errors_keep_our_sqlstates(rt, case):
    _name, released, ours, call, pattern = case
    assert released != ours
    rt.flow("f", [{"slug": "a"}, {"slug": "a2"}])
    rt.flow("fm", [{"slug": "items", "step_type": "map"}])
    steps_before = rt.val("SELECT count(*) FROM pgflow.steps")

    with raises_sqlstate(ours) as raised:
        rt.conn.execute(call)
    assert raised.error.diag.message_primary is not None
    assert __import__("re").search(pattern, raised.error.diag.message_primary), raised.error.diag.message_primary
    assert rt.val("SELECT count(*) FROM pgflow.steps") == steps_before  # nothing half-written


def test_item_6_table_constraints_still_raise_check_violation(rt):
    """Writes that bypass the functions meet the same table constraints as in the released schema."""
    rt.flow("f", [{"slug": "a"}])
    with raises_sqlstate("23514", "when_unmet_is_valid"):
        rt.conn.execute("UPDATE pgflow.steps SET when_unmet = 'ignore' WHERE flow_slug = 'f'")

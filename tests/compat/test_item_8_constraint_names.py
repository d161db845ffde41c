"""Item 8: check constraints carry the released names (schema diffs and adoption see them).

docs/compatibility.md item 8. Migration 0006 renames ``step_states.output_only_for_completed``
to the released ``output_only_for_completed_or_null``, and with it every other check whose
released name the facts give and whose condition is the same. Only names change: each
condition is pinned here, and a violation reports the released name.
"""

from __future__ import annotations

from tests.runtime.driver import raises_sqlstate

# table -> {ours before 0006: released name}
RENAMED = {
    "step_states": {
        "output_only_for_completed": "output_only_for_completed_or_null",
        "initial_tasks_nonnegative": "step_states_initial_tasks_check",
        "remaining_deps_valid": "step_states_remaining_deps_check",
        "at_most_one_terminal_timestamp": "completed_at_or_failed_at_or_skipped_at",
    },
    "runs": {
        "runs_status_check": "status_is_valid",
        "remaining_steps_valid": "runs_remaining_steps_check",
    },
    "deps": {"deps_not_self": "deps_check"},
}

ADDED: dict[str, set[str]] = {}
"""Checks 0003 adds to these tables, not renames: none (a run's restart and cancel records are
tables of their own, so ``runs`` keeps upstream's checks)."""

CHECKS = """
SELECT c.conname, pg_get_constraintdef(c.oid) AS def
FROM pg_constraint c
WHERE c.conrelid = ('pgflow.' || %s)::regclass AND c.contype = 'c'
"""


def _checks(rt, table: str) -> dict[str, str]:
    return {r["conname"]: r["def"] for r in rt.rows(CHECKS, (table,))}


def test_item_8_constraint_names_match_released(old, new):
    for table, names in RENAMED.items():
        before, after = _checks(old, table), _checks(new, table)
        for ours, released in names.items():
            assert ours in before and released not in before, (table, ours)
            assert released in after and ours not in after, (table, released)
            assert after[released] == before[ours], (table, released)  # same condition
        assert ADDED.get(table, set()) <= set(after) - set(before), table
        # nothing else changed on the table
        assert {k: v for k, v in after.items() if k not in names.values() and k not in ADDED.get(table, ())} == {
            k: v for k, v in before.items() if k not in names
        }

    new.flow("named", [{"slug": "a"}])
    run = new.start("named", {})
    with raises_sqlstate("23514", "output_only_for_completed_or_null") as raised:
        new.conn.execute("UPDATE pgflow.step_states SET output = '1' WHERE run_id = %s", (run,))
    assert raised.error.diag.constraint_name == "output_only_for_completed_or_null"

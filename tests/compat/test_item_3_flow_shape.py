"""Item 3: _get_flow_shape() of an unknown flow is {"steps": []}, as released (was NULL).

docs/compatibility.md item 3.
"""

from __future__ import annotations

QUERY = "SELECT pgflow._get_flow_shape(%s)"


def test_item_3_get_flow_shape_of_unknown_flow(old, new):
    assert old.val(QUERY, ("missing",)) is None

    assert new.val(QUERY, ("missing",)) == {"steps": []}
    new.flow("emptyFlow")
    assert new.val(QUERY, ("emptyFlow",)) == {"steps": []}
    new.flow("oneStep", [{"slug": "a"}])
    assert [s["slug"] for s in new.val(QUERY, ("oneStep",))["steps"]] == ["a"]
    # the exact-slug lookup is unchanged: another letter case is another (unknown) flow
    assert new.val(QUERY, ("onestep",)) == {"steps": []}

"""Item 9: the texts of _compare_flow_shapes() are ours, stable and documented.

docs/compatibility.md item 9. Detection matches released pgflow (step count, then per index:
slug, step type, sorted dependencies, whenUnmet, whenExhausted, the two pattern wrappers;
options never count). The wording is ours; workers log it, so every template is pinned here
exactly. One detection difference is pinned too: a missing pattern key compares as
{"defined": false}, so a shape from a worker older than conditions verifies.
"""

from __future__ import annotations

from psycopg.types.json import Jsonb


def _diff(rt, local: list[dict], stored: list[dict]) -> list[str]:
    return rt.val("SELECT pgflow._compare_flow_shapes(%s, %s)", (Jsonb({"steps": local}), Jsonb({"steps": stored})))


def test_item_9_shape_difference_texts(rt):
    stored = [
        {"slug": "a", "stepType": "single", "dependencies": [], "whenUnmet": "skip", "whenExhausted": "fail",
         "requiredInputPattern": {"defined": False}, "forbiddenInputPattern": {"defined": False}},
        {"slug": "b", "stepType": "single", "dependencies": ["a"], "whenUnmet": "skip", "whenExhausted": "fail",
         "requiredInputPattern": {"defined": False}, "forbiddenInputPattern": {"defined": False}},
    ]
    local = [
        {"slug": "a", "stepType": "map", "dependencies": [], "whenUnmet": "fail", "whenExhausted": "skip",
         "requiredInputPattern": {"defined": True, "value": {"x": 1}},
         "forbiddenInputPattern": {"defined": True, "value": {"y": 2}},
         "options": {"timeout": 99}},
        {"slug": "c", "dependencies": ["a", "z"]},
        {"slug": "d"},
    ]
    assert _diff(rt, local, stored) == [
        "step count differs: worker defines 3, database has 2" if rt.level == "baseline" else "Step count differs: 3 vs 2",
        'step 0 ("a"): step type differs: worker map, database single',
        'step 0 ("a"): whenUnmet differs: worker fail, database skip',
        'step 0 ("a"): whenExhausted differs: worker skip, database fail',
        'step 0 ("a"): requiredInputPattern (if) differs: worker {"value": {"x": 1}, "defined": true}, database {"defined": false}',
        'step 0 ("a"): forbiddenInputPattern (ifNot) differs: worker {"value": {"y": 2}, "defined": true}, database {"defined": false}',
        'step 1: slug differs: worker "c", database "b"',
        'step 1 ("b"): dependencies differ: worker ["a", "z"], database ["a"]',
        'step 2: "d" is defined by the worker but missing in the database',
    ]
    assert _diff(rt, local[:1], stored)[-1] == 'step 1: "b" exists in the database but not in the worker definition'

    # a shape without the condition keys (a worker from before conditions) matches the defaults
    legacy = [{"slug": "a", "stepType": "single", "dependencies": []},
              {"slug": "b", "stepType": "single", "dependencies": ["a"]}]
    assert _diff(rt, legacy, stored) == []

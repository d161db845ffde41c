"""complete_tasks' set-based pass (0014) against one complete_task per element, on shapes and
outputs its own tests do not drive: conditions on the released children (skip, skip-cascade,
fail), odd outputs (JSON null, a 1 MB string, unicode, nested arrays, deep objects) of single and
map steps (with a sibling single step), a map of maps fed by a JSON null, and the same batches
with Supabase's realtime.send present (element by element, the same events in the same order).

Each case drives two identical flows the same way (tests/runtime/test_batch_fast_path.py's
``Twin``): one by single calls, one by batches; every row, every returned task and the order the
next messages went out must be equal, and the batch must take the path named.
"""

from __future__ import annotations

from tests.runtime.test_batch_fast_path import Twin


def test_children_with_conditions_released_by_the_pass_end_like_single_calls(rt):
    shape = [
        {"slug": "a"},
        {"slug": "gold", "deps": ["a"], "required_input_pattern": {"a": {"tier": "gold"}}},
        {"slug": "after_gold", "deps": ["gold"]},
        {"slug": "cascade", "deps": ["a"], "forbidden_input_pattern": {"a": {"tier": "gold"}},
         "when_unmet": "skip-cascade"},
        {"slug": "after_cascade", "deps": ["cascade"]},
        {"slug": "strict", "deps": ["a"], "required_input_pattern": {"a": {"ok": True}}, "when_unmet": "fail"},
    ]
    twin = Twin(rt, shape, runs=4)
    twin.poll()
    twin.complete([(3, "a", 0, {"tier": "gold", "ok": True}), (0, "a", 0, {"tier": "lead", "ok": True}),
                   (2, "a", 0, {"tier": "gold"}), (1, "a", 0, {"ok": True})], path="set")
    for _ in range(8):
        twin.poll()
        ready = [(r, t["step_slug"], 0, {"r": r}) for r, run in enumerate(twin.runs[True])
                 for t in twin.pool[True] if t["run_id"] == run and t["step_slug"] != "a"
                 and rt.one("SELECT status FROM pgflow.step_tasks WHERE run_id = %s AND step_slug = %s",
                            (run, t["step_slug"]))["status"] == "started"]
        by_run: dict[int, tuple] = {}
        for pick in ready:
            by_run.setdefault(pick[0], pick)  # one element per run: the pass
        if not by_run:
            break
        twin.complete(list(by_run.values()), path="set")
    twin.assert_same()
    # run 2's strict step is unmet (fail): its run fails; run 3 is gold, so its cascade is skipped with its child
    statuses = [(rt.run(r)["status"], {k: v["status"] for k, v in rt.steps(r).items()}) for r in twin.runs[True]]
    assert [s[0] for s in statuses] == ["completed", "completed", "failed", "completed"]
    assert statuses[0][1]["gold"] == statuses[1][1]["gold"] == "skipped"
    assert statuses[3][1]["after_cascade"] == "skipped" and statuses[2][1]["strict"] == "failed"


ODD = [None, "x" * 1_000_000, "grüße \u2603 \U0001F600 \u202e", [[[]], [[1, [2, [3]]]]], {"k": {"k": {"k": {"k": [None]}}}},
       1e308, -0.0, 123456789012345678901234567890]


def test_odd_outputs_of_single_and_map_steps_end_like_single_calls(rt):
    shape = [{"slug": "a"}, {"slug": "m", "deps": ["a"], "step_type": "map"}, {"slug": "z", "deps": ["m"]},
             {"slug": "side", "deps": ["a"]}]
    twin = Twin(rt, shape, runs=len(ODD))
    twin.poll()
    # every run's a returns the odd values as its array: m gets one task per odd value
    twin.complete([(r, "a", 0, ODD) for r in reversed(range(len(ODD)))], path="set")
    twin.poll()
    # one odd value per run and task index, in shuffled run order; then side
    for index in range(len(ODD)):
        twin.complete([(r, "m", index, ODD[(r + index) % len(ODD)]) for r in ((index * 3 + k) % len(ODD)
                                                                             for k in range(len(ODD)))], path="set")
    twin.complete([(r, "side", 0, ODD[r]) for r in range(len(ODD))], path="set")
    twin.poll()
    twin.complete([(r, "z", 0, ODD[-1 - r]) for r in range(len(ODD))], path="set")
    twin.assert_same()
    assert [rt.run(r)["status"] for r in twin.runs[True]] == ["completed"] * len(ODD)


def test_a_map_of_a_map_and_a_null_output_feeding_a_map_end_like_single_calls(rt):
    shape = [{"slug": "a"}, {"slug": "m1", "deps": ["a"], "step_type": "map"},
             {"slug": "m2", "deps": ["m1"], "step_type": "map"}]
    twin = Twin(rt, shape, runs=3)
    twin.poll()
    # run 2: a JSON null feeding a map, a [TYPE_VIOLATION]: the whole batch goes element by element
    twin.complete([(0, "a", 0, [1, 2]), (1, "a", 0, [3]), (2, "a", 0, None)], path="elements")
    twin.poll()
    twin.complete([(0, "m1", 1, None), (1, "m1", 0, [])], path="set")
    twin.complete([(0, "m1", 0, {"x": 1})], path="set")
    twin.poll()
    twin.complete([(1, "m2", 0, "one"), (0, "m2", 1, "zero-one")], path="set")
    twin.complete([(0, "m2", 0, "zero-zero")], path="set")
    twin.assert_same()
    assert [rt.run(r)["status"] for r in twin.runs[True]] == ["completed", "completed", "failed"]
    assert rt.steps(twin.runs[True][0])["m2"]["output"] == ["zero-zero", "zero-one"]


def test_with_realtime_a_batch_broadcasts_what_single_calls_broadcast(rt):
    """Supabase: with realtime.send present a batch of several goes element by element (the pass would
    interleave events differently); the events per run, in order, are those of single calls."""
    rt.conn.execute("""
        CREATE SCHEMA realtime;
        CREATE TABLE realtime.sent (id bigserial PRIMARY KEY, payload jsonb, event text, topic text, private boolean);
        CREATE FUNCTION realtime.send(payload jsonb, event text, topic text, private boolean DEFAULT true)
        RETURNS void LANGUAGE sql AS
          $$ INSERT INTO realtime.sent (payload, event, topic, private) VALUES (payload, event, topic, private) $$;
    """)
    shape = [{"slug": "a"}, {"slug": "m", "deps": ["a"], "step_type": "map"}, {"slug": "z", "deps": ["m"]}]
    twin = Twin(rt, shape, runs=3)
    twin.poll()
    twin.complete([(2, "a", 0, [1]), (0, "a", 0, [1, 2]), (1, "a", 0, [])], path="elements")
    twin.poll()
    twin.complete([(0, "m", 1, "x"), (2, "m", 0, "y")], path="elements")
    twin.complete([(0, "m", 0, "w")], path="set")  # one element is one call's work on either path
    twin.poll()
    twin.complete([(r, "z", 0, r) for r in (1, 0, 2)], path="elements")
    twin.assert_same()

    def events(batch: bool) -> list[tuple]:
        order = {f"pgflow:run:{r}": i for i, r in enumerate(twin.runs[batch])}
        return [(order[s["topic"]], s["event"]) for s in rt.rows("SELECT * FROM realtime.sent ORDER BY id")
                if s["topic"] in order]

    assert events(True) == events(False)
    assert "run:completed" in {e for _, e in events(True)}

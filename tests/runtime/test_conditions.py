"""Conditions (if / ifNot patterns) and when_unmet: fail, skip, skip-cascade."""

from __future__ import annotations


def test_root_condition_met_runs_the_step(rt):
    rt.flow("cond_met", [{"slug": "vip", "required_input_pattern": {"tier": "gold"}}])
    run = rt.start("cond_met", {"tier": "gold", "name": "x"})
    assert rt.statuses(run) == {"vip": "started"}
    [t] = rt.poll("cond_met")
    rt.complete(run, "vip", 0, "welcome")
    assert rt.run(run)["output"] == {"vip": "welcome"}


def test_when_unmet_skip_releases_children_without_the_skipped_output(rt):
    rt.flow("cond_skip", [
        {"slug": "vip", "required_input_pattern": {"tier": "gold"}},
        {"slug": "basic"},
        {"slug": "report", "deps": ["vip", "basic"]},
    ])
    run = rt.start("cond_skip", {"tier": "silver"})
    states = rt.steps(run)
    assert (states["vip"]["status"], states["vip"]["skip_reason"]) == ("skipped", "condition_unmet")
    assert rt.tasks(run, "vip") == []  # a skipped-before-start step never gets a task
    assert states["report"]["remaining_deps"] == 1
    [basic] = rt.poll("cond_skip")
    rt.complete(run, "basic", 0, "B")
    [report] = rt.poll("cond_skip")
    assert report["input"] == {"basic": "B"}
    rt.complete(run, "report", 0, "R")
    assert rt.run(run)["status"] == "completed"


def test_when_unmet_skip_cascade_skips_everything_below(rt):
    rt.flow("cond_cascade", [
        {"slug": "gate", "required_input_pattern": {"go": True}, "when_unmet": "skip-cascade"},
        {"slug": "a", "deps": ["gate"]},
        {"slug": "b", "deps": ["a"]},
        {"slug": "free"},
    ])
    run = rt.start("cond_cascade", {"go": False})
    states = rt.steps(run)
    assert (states["gate"]["status"], states["gate"]["skip_reason"]) == ("skipped", "condition_unmet")
    assert (states["a"]["status"], states["a"]["skip_reason"]) == ("skipped", "dependency_skipped")
    assert (states["b"]["status"], states["b"]["skip_reason"]) == ("skipped", "dependency_skipped")
    assert states["free"]["status"] == "started"
    assert rt.run(run)["remaining_steps"] == 1
    rt.poll("cond_cascade")
    rt.complete(run, "free", 0, 1)
    assert rt.run(run)["output"] == {"free": 1}


def test_when_unmet_fail_fails_the_run_and_cancels_running_work(rt):
    rt.flow("cond_fail", [
        {"slug": "first"},
        {"slug": "sibling"},
        {"slug": "check", "deps": ["first"], "required_input_pattern": {"first": {"ok": True}}, "when_unmet": "fail"},
    ])
    run = rt.start("cond_fail", {})
    claimed = {t["step_slug"]: t for t in rt.poll("cond_fail")}
    assert set(claimed) == {"first", "sibling"}
    rt.complete(run, "first", 0, {"ok": False})

    assert rt.run(run)["status"] == "failed"
    check = rt.steps(run)["check"]
    assert check["status"] == "failed"
    assert "Condition not met" in check["error_message"]
    assert rt.task(run, "first")["status"] == "completed"
    assert rt.task(run, "sibling")["status"] == "cancelled"
    assert rt.tasks(run, "check") == []
    assert rt.messages("cond_fail") == []


def test_when_unmet_fail_at_start_fails_the_run_inside_start_flow(rt):
    rt.flow("cond_fail_root", [
        {"slug": "root", "required_input_pattern": {"must": 1}, "when_unmet": "fail"},
        {"slug": "other"},
    ])
    run = rt.start("cond_fail_root", {"must": 2})
    assert rt.run(run)["status"] == "failed"
    assert rt.statuses(run) == {"root": "failed", "other": "created"}
    assert rt.messages("cond_fail_root") == []  # nothing was ever sent


def test_forbidden_pattern(rt):
    rt.flow("ifnot", [
        {"slug": "not_test", "forbidden_input_pattern": {"env": "test"}},
        {"slug": "both", "required_input_pattern": {"kind": "a"}, "forbidden_input_pattern": {"blocked": True}},
    ])
    run1 = rt.start("ifnot", {"env": "test", "kind": "a"})
    assert rt.statuses(run1) == {"not_test": "skipped", "both": "started"}
    run2 = rt.start("ifnot", {"env": "prod", "kind": "a", "blocked": True})
    assert rt.statuses(run2) == {"not_test": "started", "both": "skipped"}
    for task in rt.poll("ifnot"):
        rt.complete(task["run_id"], task["step_slug"], task["task_index"], "ok")
    assert rt.run(run1)["status"] == "completed"
    assert rt.run(run2)["status"] == "completed"


def test_skipped_parent_gives_map_child_zero_tasks(rt):
    rt.flow("skipmap", [
        {"slug": "list", "required_input_pattern": {"want": True}},
        {"slug": "each", "deps": ["list"], "step_type": "map"},
    ])
    run = rt.start("skipmap", {"want": False})
    states = rt.steps(run)
    assert states["list"]["status"] == "skipped"
    assert (states["each"]["status"], states["each"]["initial_tasks"], states["each"]["output"]) == ("completed", 0, [])
    assert rt.run(run)["status"] == "completed"
    assert rt.run(run)["output"] == {"each": []}


def test_condition_after_an_empty_map_is_still_checked(rt):
    """An empty map completes without tasks; the conditional step behind it must still be evaluated."""
    rt.flow("emptycond", [
        {"slug": "each", "step_type": "map"},
        {"slug": "gate", "deps": ["each"], "required_input_pattern": {"each": [1]}},
        {"slug": "end", "deps": ["gate"]},
    ])
    run = rt.start("emptycond", [])
    states = rt.steps(run)
    assert states["each"]["status"] == "completed"
    assert (states["gate"]["status"], states["gate"]["skip_reason"]) == ("skipped", "condition_unmet")
    assert states["end"]["status"] == "started"
    [end] = rt.poll("emptycond")
    assert end["input"] == {}
    rt.complete(run, "end", 0, "e")
    assert rt.run(run)["status"] == "completed"


def test_cascade_resolve_conditions_return_values(rt):
    rt.flow("crc", [{"slug": "a"}], max_attempts=1)
    run = rt.start("crc", {})
    assert rt.val("SELECT pgflow.cascade_resolve_conditions(%s)", (run,)) is True
    rt.poll("crc")
    rt.fail(run, "a", 0)
    assert rt.val("SELECT pgflow.cascade_resolve_conditions(%s)", (run,)) is False

"""The optional pruning function: the 0003 migration upgrades an installed baseline copy in place."""

from __future__ import annotations

import re

from pgflow_cli import sqlfiles
from tests.stage1.conftest import upgrade


def _prune_source(rt) -> str | None:
    return rt.val(
        "SELECT p.prosrc FROM pg_proc p WHERE p.oid = to_regprocedure('pgflow.prune_data_older_than(interval)')"
    )


def _body(file: str) -> str:
    """The function body of an optional pruning file (between its dollar quotes)."""
    match = re.search(r"AS \$\$(.*?)\$\$;", sqlfiles.load(file), re.S)
    assert match, file
    return match.group(1)


def _age_finished(rt, days: int = 100) -> None:
    rt.conn.execute(
        "UPDATE pgflow.runs SET started_at = started_at - make_interval(days => %s), "
        "completed_at = completed_at - make_interval(days => %s) WHERE status = 'completed'",
        (days, days),
    )


def test_installed_baseline_pruning_is_upgraded_and_prunes_by_route(old_rt, baseline_db):
    rt = old_rt
    rt.conn.execute(sqlfiles.load("optional/prune_baseline.sql"))
    assert _prune_source(rt) == _body("optional/prune_baseline.sql")
    assert "FROM pgflow.flows AS f ORDER BY f.flow_slug" in _prune_source(rt)  # the baseline reads flow slugs

    # the released runtime leaves a finished run of a camelCase flow (queue listed as "PruneMe")
    rt.flow("PruneMe", [{"slug": "a"}])
    old = rt.start("PruneMe", {})
    rt.poll("PruneMe")
    rt.complete(old, "a", 0, 1)

    upgrade(baseline_db, rt)
    source = _prune_source(rt)
    assert source == _body("optional/prune.sql")  # upgraded in place, same text as a fresh install
    assert "SELECT DISTINCT s.queue_name FROM pgflow.steps AS s" in source
    assert "f.flow_slug" not in source

    # a route that is not the flow slug's queue: only a route-aware pruner finds its archive
    rt.conn.execute("SELECT pgmq.create('sidetrack')")
    rt.flow("Moved", [{"slug": "a"}])
    rt.conn.execute("UPDATE pgflow.steps SET queue_name = 'sidetrack' WHERE flow_slug = 'Moved'")
    moved = rt.start("Moved", {})
    assert rt.task(moved, "a")["queue_name"] == "sidetrack"
    msg = rt.task(moved, "a")["message_id"]
    rt.conn.execute(
        "UPDATE pgflow.step_tasks SET status = 'started', attempts_count = 1, started_at = now() WHERE run_id = %s",
        (moved,),
    )
    rt.complete(moved, "a", 0, 2)
    assert [m["msg_id"] for m in rt.archived("sidetrack")] == [msg]
    recent = rt.start("PruneMe", {})
    rt.poll("PruneMe")
    rt.complete(recent, "a", 0, 3)

    _age_finished(rt)
    rt.conn.execute("UPDATE pgflow.runs SET completed_at = now(), started_at = now() WHERE run_id = %s", (recent,))
    for queue in ("pruneme", "sidetrack"):
        rt.conn.execute(
            f"UPDATE pgmq.a_{queue} SET archived_at = archived_at - interval '100 days' "
            "WHERE message->>'run_id' <> %s",
            (str(recent),),
        )
    summary = rt.val("SELECT pgflow.prune_data_older_than(interval '90 days')")
    assert (summary["runs"], summary["archived_messages"], summary["live_messages_archived"]) == (2, 2, 0)
    assert rt.run(old) is None and rt.run(moved) is None
    assert rt.run(recent)["status"] == "completed"
    assert rt.archived("sidetrack") == []
    assert [m["message"]["run_id"] for m in rt.archived("pruneme")] == [str(recent)]
    assert rt.val("SELECT count(*) FROM pgflow.flows") == 2  # definitions are never pruned
    rt.conn.execute("UPDATE pgflow.steps SET queue_name = 'moved' WHERE flow_slug = 'Moved'")


def test_the_migration_does_not_install_pruning_unasked(old_rt, baseline_db):
    assert _prune_source(old_rt) is None
    upgrade(baseline_db, old_rt)
    assert _prune_source(old_rt) is None

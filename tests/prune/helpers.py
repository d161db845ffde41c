"""History of several ages and states for the pruning tests: real runs driven through the runtime,
then moved into the past (every timestamp of a run shifted alike, so every check constraint holds)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

OLD = "40 days"
"""How far :func:`age_run` moves a run back; the tests prune with ``--older-than 30d``."""
CUTOFF_DAYS = 30


def age_run(rt, run_id: uuid.UUID, by: str = OLD) -> None:
    """Move one run, its step states and tasks ``by`` into the past."""
    rt.conn.execute("UPDATE pgflow.runs SET started_at = started_at - %s::interval, "
                    "completed_at = completed_at - %s::interval, failed_at = failed_at - %s::interval "
                    "WHERE run_id = %s", (by, by, by, run_id))
    rt.conn.execute("UPDATE pgflow.step_states SET created_at = created_at - %s::interval, "
                    "started_at = started_at - %s::interval, completed_at = completed_at - %s::interval, "
                    "failed_at = failed_at - %s::interval, skipped_at = skipped_at - %s::interval "
                    "WHERE run_id = %s", (by, by, by, by, by, run_id))
    rt.conn.execute("UPDATE pgflow.step_tasks SET queued_at = queued_at - %s::interval, "
                    "started_at = started_at - %s::interval, completed_at = completed_at - %s::interval, "
                    "failed_at = failed_at - %s::interval WHERE run_id = %s", (by, by, by, by, run_id))


def age_archive(rt, queue: str, by: str = OLD) -> int:
    """Move every archived message of ``queue`` back; returns how many."""
    cur = rt.conn.execute(f"UPDATE pgmq.a_{queue} SET archived_at = archived_at - %s::interval", (by,))
    return cur.rowcount


@dataclass
class History:
    """Run ids by what a prune with a 30-day cutoff must do with them."""

    gone: list[uuid.UUID]
    kept: list[uuid.UUID]
    in_flight: uuid.UUID


def build_history(rt, slug: str = "orders", *, old_completed: int = 3) -> History:
    """Flow ``a -> b``: ``old_completed`` completed runs and one failed run, all 40 days old (to go);
    a completed run of today, a started run 40 days old with a queued task, and one with a task a
    worker holds (to stay)."""
    rt.flow(slug, [{"slug": "a"}, {"slug": "b", "deps": ["a"]}], max_attempts=1, base_delay=0)
    old = [rt.start(slug, {"i": i}) for i in range(old_completed)]
    rt.drive(slug, lambda task: {"ok": True})
    failed = rt.start(slug, {"f": 1})
    (task,) = rt.poll(slug)
    rt.fail(failed, task["step_slug"], task["task_index"], "boom")
    assert rt.run(failed)["status"] == "failed"
    recent = rt.start(slug, {"r": 1})
    rt.drive(slug, lambda task: {"ok": True})
    for run_id in old + [failed]:
        age_run(rt, run_id)
    queued = rt.start(slug, {"q": 1})
    age_run(rt, queued)
    in_flight = rt.start(slug, {"h": 1})
    assert len(rt.claim(slug, [rt.task(in_flight, "a")["message_id"]])) == 1
    age_run(rt, in_flight)
    return History(gone=old + [failed], kept=[recent, queued, in_flight], in_flight=in_flight)

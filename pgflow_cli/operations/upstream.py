"""``pgflow migrate`` on databases installed by pgflow itself: recognise, plan and carry out the adoption.

What ``migrate status``, ``plan``, ``apply`` and ``pgflow audit`` need around
:mod:`pgflow_cli.upstream`: the recognised release in words, the path (adopt release X ->
baseline -> the pending migrations), what the operator must know or do first (workers, pg_cron
jobs, the Supabase migration history), and the adoption step itself with its refusals.

Spec: issue 8.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgflow_cli import sqlfiles
from pgflow_cli.errors import UsageError
from pgflow_cli.upstream import adopt as adoption
from pgflow_cli.upstream import recognise as rec
from pgflow_cli.upstream import releases

Progress = Callable[[str, dict[str, Any]], None]

SUPABASE_ADVICE = (
    "supabase_migrations.schema_migrations lists {count} pgflow migration(s) (pgflow {release}); pgflow-cli "
    "leaves that table alone. From now on pgflow-cli owns the pgflow schema: do not add pgflow's later migration "
    "files to supabase/migrations (`npx pgflow install`), keep the ones already applied as they are, and create "
    "new environments with `pgflow migrate apply` (docs/upgrade.md \"Databases installed by pgflow itself\")"
)


@dataclass
class UpstreamPlan:
    """What adopting this database involves (nothing is changed to find out).

    Attributes:
        recognition: what installed the schema.
        steps: the path, in words, e.g. ``["adopt pgflow 0.8.0/0.8.1/0.9.0/0.9.1 -> baseline ..."]``
            (the pending migrations after it are listed by the caller).
        must_do: what the operator must do before or after ``apply``, one sentence each.
        notes: what happens without the operator's action (cron jobs that keep working...).
        completion: online completion steps left by an adoption that was interrupted after its commit
            (the history backfill is not one of them: see ``history``).
        history: the history backfill still to run (``{"step": "backfill", "next_page": n}``), or
            ``None``. Optional since migration 0003: ``get_run_with_states`` computes those outputs,
            and ``pgflow migrate apply`` stores them only with ``--fill-history``.
    """

    recognition: rec.Recognition
    steps: list[str] = field(default_factory=list)
    must_do: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    completion: list[dict[str, Any]] = field(default_factory=list)
    history: dict[str, Any] | None = None

    @property
    def adoption_pending(self) -> bool:
        """True when ``apply`` has an adoption to run (recognised or asserted, not yet adopted)."""
        return self.recognition.adoptable

    def to_dict(self) -> dict[str, Any]:
        return {"recognition": self.recognition.to_dict(), "steps": self.steps, "must_do": self.must_do,
                "notes": self.notes, "completion": self.completion, "history": self.history}


def _validate_release(assume_release: str | None) -> None:
    if assume_release is not None and assume_release not in releases.RELEASES:
        raise UsageError(f"--assume-release {assume_release!r} is not a release pgflow-cli knows",
                         hint=f"known releases: {', '.join(releases.RELEASES)}")


def inspect(conn: psycopg.Connection, *, assume_release: str | None = None) -> UpstreamPlan:
    """Recognise the database and describe its adoption (read-only).

    Args:
        conn: any open connection.
        assume_release: ``--assume-release``: the release the operator asserts for an
            unrecognised schema (recorded with the adoption).

    Returns:
        An :class:`UpstreamPlan`; for a database pgflow-cli installed, ``steps`` is empty and
        ``completion`` lists what an interrupted online adoption left.

    Raises:
        UsageError: ``assume_release`` is not a release recognition knows (exit 2).
    """
    _validate_release(assume_release)
    found = rec.recognise(conn, assume_release=assume_release)
    plan = UpstreamPlan(found)
    if found.status == rec.ADOPTED:
        pending = adoption.pending_completion(conn)
        plan.completion = [s for s in pending if s["step"] != adoption.HISTORY_STEP]
        plan.history = next((s for s in pending if s["step"] == adoption.HISTORY_STEP), None)
        if plan.completion:
            plan.steps.append(f"finish the adoption online ({', '.join(_step_names(plan.completion))})")
        history = adoption.history_pending(conn)
        if history is not None:
            plan.notes.append(HISTORY_NOTE.format(where=history.describe()))
        return plan
    if found.status not in (rec.UPSTREAM, rec.UNRECOGNISED):
        return plan
    large = found.adoptable and adoption.large(conn)
    if found.adoptable:
        asserted = " (asserted by the operator)" if found.assumed else ""
        path = ("one short transaction, then online (index built concurrently, constraints validated; the "
                "finished runs' step outputs are left to get_run_with_states, stored only with --fill-history)"
                if large else "one transaction")
        plan.steps.append(f"adopt pgflow {found.label if not found.assumed else found.release}{asserted} -> "
                          f"pgflow-cli baseline (0001, 0002 recorded), in {path}")
    plan.must_do.append(
        f"stop every worker of pgflow {found.label} before `apply`: after the adoption they would run against "
        "pgflow-cli's runtime, and after 0003 only workers speaking protocol 2 can start")
    if _before(found, "0.12.0"):
        plan.must_do.append("workers older than 0.12 read `input.run`; tasks claimed after the adoption no longer "
                            "carry it (dependent steps get their dependencies' outputs, root steps the run input)")
    if _before(found, "0.13.0"):
        plan.notes.append(
            "step outputs were not stored by this release: the adoption backfills every completed step as 0.13.0 "
            "did, the runs in flight inside its transaction" + (
                "; for the finished runs get_run_with_states computes them from their tasks (migration 0003): "
                "step_states.output stays null for them until `pgflow migrate apply --fill-history` stores them "
                "online, after the migrations" if large else ""))
    if "worker_functions" in releases.shape(releases.group_of(found.releases[-1]))["table"]:
        disabled = [r[0] for r in conn.execute(sqlfiles.statement(adoption.QUERIES, "disabled_functions")).fetchall()]
        if disabled:
            plan.must_do.append(
                f"{len(disabled)} worker function(s) have enabled = false ({', '.join(disabled)}): upstream only stopped "
                "pinging them; in pgflow-cli that is the rollout fence, so their workers refuse to register until you "
                "enable them (UPDATE pgflow.worker_functions SET enabled = true WHERE function_name = ...)")
    for job in found.cron_jobs:
        (plan.notes if job.keeps_working else plan.must_do).append(job.verdict())
    if not any("requeue_stalled_tasks" in job.calls for job in found.cron_jobs):
        plan.must_do.append(
            "no pg_cron job requeues stalled tasks: tasks started by workers that are gone stay started until you "
            "run `SELECT pgflow.requeue_stalled_tasks()` or schedule it "
            "(`SELECT pgflow.setup_requeue_stalled_tasks_cron()` with pg_cron)")
    if found.supabase:
        plan.must_do.append(SUPABASE_ADVICE.format(count=len(found.supabase.rows),
                                                   release="/".join(found.supabase.releases) or "unknown"))
    if found.body_differences:
        plan.notes.append(f"{len(found.body_differences)} function bod(ies) are not the release's: "
                          f"{', '.join(found.body_differences)}; the adoption replaces them")
    for name in found.optional:
        plan.notes.append(f"the optional {name} is replaced by pgflow-cli's version, keeping its grants")
    if found.assumed and found.differences:
        plan.notes.append("what differs from the asserted release is kept as it is and recorded with the adoption")
    return plan


HISTORY_NOTE = ("optional, not run by default: the history backfill has not stored the step outputs of runs that "
                "finished before the adoption ({where}); get_run_with_states computes them from their tasks "
                "(migration 0003), but step_states.output (your queries, `pgflow runs show --output`, a drop-flow "
                "export's step states) is null for them until `pgflow migrate apply --fill-history` stores them "
                "(online, in batches, resumable)")


def _step_names(completion: list[dict[str, Any]]) -> list[str]:
    names: list[str] = []
    for step in completion:
        label = step["step"] if step["step"] != "validate" else "validate constraints"
        if label not in names:
            names.append(label)
    return names


def _before(found: rec.Recognition, version: str) -> bool:
    key = tuple(int(p) for p in version.split("."))
    return bool(found.releases) and all(tuple(int(p) for p in r.split(".")) < key for r in found.releases)


def refusal(plan: UpstreamPlan) -> Exception | None:
    """The error that stops ``apply`` for this plan (an unrecognised schema without an asserted
    release, exit 6 with every difference), or ``None``."""
    found = plan.recognition
    if found.status == rec.UNRECOGNISED and not found.adoptable:
        try:
            adoption.check_adoptable(found)
        except Exception as exc:  # StateConflict, built in one place
            return exc
    return None


def run(conn: psycopg.Connection, plan: UpstreamPlan, *, assume_release: str | None = None,
        lock_timeout: float = 5.0, attempts: int = 5, dry_run: bool = False, online: str = "auto",
        batch_seconds: float = 0.2, progress: Progress | None = None,
        before_commit: Callable[[psycopg.Connection], None] | None = None) -> adoption.Adopted | int | None:
    """Carry out what ``plan`` needs before the migrations: the adoption, or an interrupted one's completion.

    Returns:
        The :class:`~pgflow_cli.upstream.adopt.Adopted` outcome, the number of completion steps
        done (an interrupted online adoption), or ``None`` when there was nothing to do.

    Raises:
        StateConflict: unrecognised and nothing asserted, or the schema changed since ``plan``.
        LockTimeout: see :func:`pgflow_cli.upstream.adopt.adopt`.
    """
    if plan.completion:
        if dry_run:
            return None
        return adoption.complete(conn, lock_timeout=lock_timeout, attempts=attempts, progress=progress,
                                 batch_seconds=batch_seconds, history=False)
    if plan.recognition.status not in (rec.UPSTREAM, rec.UNRECOGNISED):
        return None
    return adoption.adopt(conn, plan.recognition, lock_timeout=lock_timeout, attempts=attempts, dry_run=dry_run,
                          progress=progress, before_commit=before_commit, assume_release=assume_release,
                          online=online, batch_seconds=batch_seconds)


def history_left(conn: psycopg.Connection) -> bool:
    """True when an online adoption's history backfill is still to run (reads the record only)."""
    return adoption.history_pending(conn) is not None


def finish_history(conn: psycopg.Connection, *, lock_timeout: float = 5.0, attempts: int = 5,
                   batch_seconds: float = 0.2, progress: Progress | None = None) -> bool:
    """Run the history backfill an online adoption left (after the migrations; resumable).

    Returns:
        True when there was one to run (it is done now), False when nothing was pending.

    Raises:
        LockTimeout: a batch could not take its row locks within the retries (exit 4); rerun
            ``pgflow migrate apply`` to continue from the recorded page.
    """
    if adoption.history_pending(conn) is None:
        return False
    adoption.complete(conn, lock_timeout=lock_timeout, attempts=attempts, progress=progress,
                      batch_seconds=batch_seconds, history=True)
    return True


def live_workers(conn: psycopg.Connection) -> dict[str, int]:
    """Workers of the upstream release that still heartbeat: ``{"alive", "functions"}`` (read-only)."""
    row = conn.execute(sqlfiles.statement(adoption.QUERIES, "live_workers")).fetchone()
    return {"alive": int(row[0]), "functions": int(row[1])} if row else {"alive": 0, "functions": 0}


def sql_script(conn: psycopg.Connection, plan: UpstreamPlan) -> str:
    """The adoption as one reviewable SQL script (``migrate apply --sql``)."""
    return adoption.describe(adoption.adoption_parts(conn, plan.recognition))

"""``pgflow prune``: bounded history, deleted in short batches (docs/commands/prune.md).

What goes, all older than one cutoff fixed on the server's clock when the prune starts:

1. finished runs (completed or failed before the cutoff) with their step states and tasks: batches of
   ``pgflow.prune_runs``, walking the runs' primary key (a keyset cursor), each batch its own
   transaction that locks its runs ``FOR UPDATE SKIP LOCKED`` and never waits for a worker;
2. worker rows without a heartbeat since the cutoff and without a task in flight: ``workers forget``'s
   one transaction (:func:`pgflow_cli.operations.workers.forget`);
3. PGMQ archive rows (``pgmq.a_<queue>`` of every queue a step routes to) archived before the cutoff:
   batches of ``pgflow.prune_archive``.

Every batch is one statement in one transaction, so it works through a transaction pooler, and a prune
that was stopped anywhere is finished by running it again. The batch step is SQL (not a query file)
so that a batch is one round trip: its run locks are held for the batch's own work only, never across
network round trips, which is what a worker waiting for one of those runs would feel.

Nothing here prints; :class:`Progress` callbacks tell the command what happened.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgflow_cli import sqlfiles
from pgflow_cli.db import retry_on_lock, scalar, transaction
from pgflow_cli.errors import UsageError
from pgflow_cli.operations import schema
from pgflow_cli.operations import workers as workers_op

QUERIES = "queries/prune.sql"

DOCUMENT_KIND = "pgflow-cli/prune"
DOCUMENT_VERSION = 1

MIN_OLDER_THAN = workers_op.MIN_STALE_FOR
"""Seconds: the shortest ``--older-than`` (the worker rule of ``workers forget``: a worker silent for
less than a minute may still be alive)."""
MAX_BATCH_SIZE = 10_000
ARCHIVE_ROWS_PER_RUN = 10
"""Archive rows deleted per batch per run of ``--batch-size`` (capped at 100,000): an archive row is
one small row nobody locks, a run comes with its step states and tasks."""
PHASES = ("runs", "workers", "archives")


@dataclass
class Totals:
    """What a prune deleted (or, dry run, would delete) so far.

    Attributes:
        runs: finished runs deleted; ``runs_by_status``: the same by status (completed, failed).
        step_states / step_tasks: rows deleted with those runs.
        skipped_locked: finished runs another session held during their batch (left for the next prune).
        kept_open_tasks: finished runs still holding a queued or started task (never deleted).
        scanned: runs looked at (every state).
        workers: worker rows deleted.
        archives: per queue, archive rows deleted.
        batches: transactions committed (dry run: statements run).
    """

    runs: int = 0
    runs_by_status: dict[str, int] = field(default_factory=lambda: {"completed": 0, "failed": 0})
    step_states: int = 0
    step_tasks: int = 0
    skipped_locked: int = 0
    kept_open_tasks: int = 0
    scanned: int = 0
    workers: int = 0
    archives: dict[str, int] = field(default_factory=dict)
    batches: int = 0

    @property
    def archived_messages(self) -> int:
        return sum(self.archives.values())

    def add_runs(self, batch: dict[str, Any]) -> None:
        for key in ("runs", "step_states", "step_tasks", "skipped_locked", "kept_open_tasks", "scanned"):
            setattr(self, key, getattr(self, key) + int(batch[key]))
        for status, n in batch["runs_by_status"].items():
            self.runs_by_status[status] = self.runs_by_status.get(status, 0) + int(n)
        self.batches += 1

    def to_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "runs_by_status": dict(self.runs_by_status), "step_states": self.step_states,
                "step_tasks": self.step_tasks, "skipped_locked": self.skipped_locked,
                "kept_open_tasks": self.kept_open_tasks, "runs_scanned": self.scanned, "workers": self.workers,
                "archived_messages": self.archived_messages,
                "archives": [{"queue_name": q, "rows": n} for q, n in sorted(self.archives.items())],
                "batches": self.batches}


@dataclass(frozen=True)
class Progress:
    """Where a prune is, after each batch.

    Attributes:
        phase: ``runs``, ``workers`` or ``archives``.
        totals: everything so far (the same object the report ends with).
        detail: the queue being pruned (archives), else ``""``.
        seconds: since the prune started.
    """

    phase: str
    totals: Totals
    detail: str
    seconds: float


@dataclass
class PruneReport:
    """A whole prune: its parameters and :class:`Totals`.

    Attributes:
        older_than: the ``--older-than`` seconds; cutoff: the server time it became.
        batch_size: runs per batch; dry_run: nothing was deleted.
        totals: what was deleted (would be).
        complete: every phase ran to its end (False when interrupted; what was deleted stays deleted).
        seconds: wall time.
    """

    older_than: float
    cutoff: dt.datetime
    batch_size: int
    dry_run: bool
    totals: Totals
    complete: bool = False
    seconds: float = 0.0

    def to_document(self) -> dict[str, Any]:
        """The versioned JSON document (docs/schemas/prune.schema.json), without the common head."""
        return {"kind": DOCUMENT_KIND, "version": DOCUMENT_VERSION, "dry_run": self.dry_run,
                "older_than_seconds": self.older_than, "cutoff": self.cutoff.astimezone(dt.timezone.utc).isoformat(),
                "batch_size": self.batch_size, "complete": self.complete, "seconds": round(self.seconds, 3),
                "deleted": self.totals.to_dict()}


def check_options(older_than: float, batch_size: int) -> None:
    """Refuse what a prune must not start with.

    Raises:
        UsageError: ``older_than`` below :data:`MIN_OLDER_THAN` seconds or ``batch_size`` outside
            1..:data:`MAX_BATCH_SIZE` (exit 2).
    """
    if older_than < MIN_OLDER_THAN:
        raise UsageError(f"--older-than must be at least {MIN_OLDER_THAN:g} seconds, got {older_than:g}",
                         hint="history is pruned in days; a worker silent for under a minute may still be alive")
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise UsageError(f"--batch-size must be 1 to {MAX_BATCH_SIZE:,}, got {batch_size}")


def require_installed(conn: psycopg.Connection) -> None:
    """Raise :class:`pgflow_cli.errors.SchemaMissing` (exit 3) where ``pgflow.prune_runs`` is missing."""
    schema.require_objects(conn, QUERIES, "the prune batches (pgflow.prune_runs, pgflow.prune_archive)")


def prune(conn: psycopg.Connection, *, older_than: float, batch_size: int = 500, dry_run: bool = False,
          on_progress: Callable[[Progress], None] | None = None, lock_timeout: float = 5.0,
          statement_timeout: float = 300.0, attempts: int = 3,
          on_retry: Callable[[int, BaseException, float], None] | None = None) -> PruneReport:
    """Prune finished runs, dead worker rows and old archive rows, in batches.

    Args:
        conn: an autocommit connection (direct or through a transaction pooler).
        older_than: seconds; what ended (or was archived, or last heartbeat) before now minus this goes.
        batch_size: runs per batch (1..10,000); archive rows per batch are ten times as many.
        dry_run: count what would go, in read-only transactions; lock and delete nothing.
        on_progress: called after each batch with a :class:`Progress`.
        lock_timeout: seconds a batch may wait for a lock (it skips locked runs; this bounds the rest:
            a foreign-key check, a worker row a heartbeat holds).
        statement_timeout: seconds one batch may run.
        attempts: transactions tried per batch on a lock timeout or deadlock.
        on_retry: called before a batch is retried (see :func:`pgflow_cli.db.retry_on_lock`).

    Returns:
        The :class:`PruneReport` (``complete`` True).

    Raises:
        UsageError: bad ``older_than`` or ``batch_size`` (exit 2).
        SchemaMissing: no prune batches in this database (exit 3).
        LockTimeout: a batch kept meeting a lock (exit 4); the batches before it stay committed.
        KeyboardInterrupt: between or during batches; committed batches stay, the current one rolls back.
    """
    check_options(older_than, batch_size)
    require_installed(conn)
    started = time.monotonic()
    cutoff = scalar(conn.execute(sqlfiles.statement(QUERIES, "cutoff"), {"older_than": float(older_than)}))
    report = PruneReport(older_than, cutoff, batch_size, dry_run, Totals())
    totals = report.totals

    def tell(phase: str, detail: str = "") -> None:
        report.seconds = time.monotonic() - started
        if on_progress is not None:
            on_progress(Progress(phase, totals, detail, report.seconds))

    def batch(name: str, params: dict[str, Any]) -> Any:
        def once() -> Any:
            with transaction(conn, read_only=dry_run, lock_timeout=lock_timeout, statement_timeout=statement_timeout):
                return scalar(conn.execute(sqlfiles.statement(QUERIES, name), params))
        return retry_on_lock(once, attempts=attempts, on_retry=on_retry)

    tell("runs")
    after = None
    while True:
        result = batch("runs", {"cutoff": cutoff, "after": after, "batch_size": batch_size, "dry_run": dry_run})
        totals.add_runs(result)
        tell("runs")
        if result["done"]:
            break
        after = result["last_run_id"]

    tell("workers")
    forgotten = retry_on_lock(lambda: workers_op.forget(conn, stale_for=older_than, dry_run=dry_run,
                                                        lock_timeout=lock_timeout),
                              attempts=attempts, on_retry=on_retry)
    totals.workers = len(forgotten.forgotten)
    totals.batches += 1
    tell("workers")

    archive_batch = min(100_000, batch_size * ARCHIVE_ROWS_PER_RUN)
    queues = [r[0] for r in conn.execute(sqlfiles.statement(QUERIES, "queues")).fetchall()]
    for queue in queues:
        totals.archives[queue] = 0
        while True:
            try:
                rows = int(batch("archive", {"queue_name": queue, "cutoff": cutoff, "batch_size": archive_batch,
                                             "dry_run": dry_run}))
            except (psycopg.errors.InvalidParameterValue, psycopg.errors.UndefinedTable):
                break  # its flow was dropped meanwhile, archive and all
            totals.archives[queue] += rows
            totals.batches += 1
            tell("archives", queue)
            if dry_run or rows < archive_batch:
                break

    report.complete = True
    report.seconds = time.monotonic() - started
    return report

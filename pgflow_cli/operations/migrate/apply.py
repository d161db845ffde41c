"""``migrate apply``: the preflight audit, the engine's run of the adoption, the migrations and the
history backfill as one run, the lock watcher, and what the run returns.

Applying is one run of the installer's engine (:func:`pgflow_cli.installer.run`) plus what an
operator needs around it:

* a **preflight audit** before any lock is taken (for migrations marked ``--@preflight
  audit``): blocking findings refuse the upgrade with the complete list (exit 1) and nothing
  is changed; the migration itself rechecks the same rules under its locks;
* a **lock watcher**: a second connection that, while the migration waits for a lock,
  names the blocking sessions (pid, application name, state, seconds) without their
  query text;
* bounded **retries** on lock timeouts and deadlocks only, with backoff (the engine's);
* **dry runs**: the next step runs and is rolled back, reporting rows touched per table and the
  relation locks it held (and for how long: every lock is held until the end of its transaction).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgflow_cli import installer, sqlfiles
from pgflow_cli.db import Target, connect
from pgflow_cli.errors import LockTimeout, StateConflict
from pgflow_cli.installer.events import Blocked, PreflightPassed, ProgressFn, WorkersAlive
from pgflow_cli.operations import upstream
from pgflow_cli.operations.migrate.plan import preflight
from pgflow_cli.operations.migrate.verdict import blocking_conflict
from pgflow_cli.upstream.adopt import Adopted, Completed

QUERIES = "queries/migrate.sql"


@dataclass
class Phase:
    """One step of a migrate run, for progress and the JSON result.

    Attributes:
        name: ``preflight``, ``lock``, ``apply <migration>`` ...
        seconds: wall time.
        detail: phase-specific data (attempts, rows touched, locks held).
    """

    name: str
    seconds: float
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seconds": round(self.seconds, 3), **self.detail}


@dataclass
class MigrateResult:
    """Outcome of ``pgflow migrate apply``."""

    dry_run: bool
    applied: list[str] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)
    blockers_seen: list[dict[str, Any]] = field(default_factory=list)
    protocol_change: dict[str, int] | None = None
    adoption: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "applied": self.applied,
            "phases": [p.to_dict() for p in self.phases],
            "blockers_seen": self.blockers_seen,
            "protocol_change": self.protocol_change,
            "adoption": self.adoption,
        }

    def add(self, outcome: installer.Outcome) -> None:
        """One step's outcome: a phase (``apply <label>`` with its attempts, duration and what a dry
        run measured; the history backfill under its own name); an online adoption's completion
        belongs to the adoption's phase."""
        if isinstance(outcome, Completed):
            if outcome.history:
                self.phases.append(Phase("history backfill (adoption, online)", outcome.duration_ms / 1000))
            return
        detail = {"migration": outcome.label, "attempts": outcome.attempts, "duration_ms": outcome.duration_ms,
                  **(outcome.measured or {})}
        self.phases.append(Phase(f"apply {outcome.label}", outcome.duration_ms / 1000, detail))
        if not outcome.dry_run:
            self.applied.append(outcome.label)
        if isinstance(outcome, Adopted):
            self.adoption = {"release": outcome.release, "releases": list(outcome.releases),
                             "assumed": outcome.assumed, "differences": outcome.differences, "mended": outcome.mended,
                             "online": outcome.online, "dry_run": outcome.dry_run}


class LockWatcher:
    """Reports sessions blocking the migrator's backend while it waits for a lock.

    Args:
        target: where to connect (a second, short-lived connection).
        pid: the migrator's backend pid.
        report: called as ``report(blockers, waiting_on)`` when the set of blockers changes,
            and again every ``repeat`` seconds while it persists.
        interval: seconds between samples.
        repeat: seconds between repeated reports of an unchanged blocker set.
    """

    def __init__(self, target: Target, pid: int, report: Callable[[list[dict[str, Any]], dict[str, Any] | None], None],
                 *, interval: float = 0.25, repeat: float = 5.0) -> None:
        self.target = target
        self.pid = pid
        self.report = report
        self.interval = interval
        self.repeat = repeat
        self.seen: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pgflow-lock-watcher", daemon=True)

    def __enter__(self) -> LockWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            conn = connect(self.target, application_name="pgflow-cli lock-watcher", connect_timeout=5)
        except Exception:
            return  # watching is best effort; the migration itself reports the timeout
        last_key: tuple[int, ...] = ()
        last_report = 0.0
        try:
            with conn.cursor(row_factory=dict_row) as cur:
                while not self._stop.wait(self.interval):
                    blockers = cur.execute(sqlfiles.statement(QUERIES, "blocking_sessions"), {"pid": self.pid}).fetchall()
                    key = tuple(sorted(b["pid"] for b in blockers))
                    now = time.monotonic()
                    if blockers and (key != last_key or now - last_report >= self.repeat):
                        waiting = cur.execute(sqlfiles.statement(QUERIES, "waiting_on"), {"pid": self.pid}).fetchone()
                        self.report(blockers, waiting)
                        last_report = now
                        for blocker in blockers:
                            if blocker["pid"] not in {s["pid"] for s in self.seen}:
                                self.seen.append(dict(blocker))
                    last_key = key
        except psycopg.Error:
            pass
        finally:
            conn.close()


def describe_blocker(blocker: dict[str, Any]) -> str:
    """One line per blocking session: pid, application, state, duration (never its query)."""
    modes = f", holds {blocker['lock_modes']}" if blocker.get("lock_modes") else ""
    return (f"pid {blocker['pid']} ({blocker['application_name']}, user {blocker['user_name']}), "
            f"{blocker['state'] or 'unknown state'} for {blocker['seconds']}s{modes}")


def live_workers(conn: psycopg.Connection, pending: list[installer.Migration]) -> dict[str, int] | None:
    """Workers a pending protocol change would strand: ``{"alive", "functions", "enabled_functions",
    "protocol"}``, or ``None`` when no pending migration changes the worker protocol or no worker table exists."""
    protocols = [m.worker_protocol for m in pending if m.worker_protocol]
    if not protocols or not installer.read_state(conn).has_flows_table:
        return None
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(sqlfiles.statement(QUERIES, "live_workers")).fetchone()
    return {**(row or {}), "protocol": max(protocols)}


def apply(
    conn: psycopg.Connection,
    target: Target,
    *,
    target_version: int | None = None,
    lock_timeout: float = 5.0,
    attempts: int = 5,
    dry_run: bool = False,
    progress: ProgressFn | None = None,
    online: str = "auto",
    batch_seconds: float = 0.2,
    install_pgmq: bool = False,
    assume_release: str | None = None,
    fill_history: bool = False,
) -> MigrateResult:
    """Apply (or dry-run) what is pending, as one run of the engine, with a lock watcher; see the
    module docstring.

    A database installed by a published pgflow release (no ledger) is adopted first
    (:mod:`pgflow_cli.operations.upstream`): the preflight audit runs before it, the adoption is a
    step of the same run (the same migrators' lock, lock timeout and retries), and the pending
    migrations after the baseline follow. In a dry run only the adoption runs (and is rolled
    back): the migrations after it need it committed.

    Args:
        conn: autocommit connection of the migrator.
        target: connection target (the watcher opens its own connection).
        target_version: stop after this migration version.
        lock_timeout: seconds any statement may wait for a lock before the migration is
            rolled back and retried.
        attempts: tries per transaction (lock timeouts and deadlocks only).
        dry_run: roll back the next step after measuring it.
        progress: receives the run's events (:mod:`pgflow_cli.installer.events`) and the ones of
            this command (:class:`PreflightPassed`, :class:`WorkersAlive`, :class:`Blocked`).
        online: phased-migration choice (``auto``, ``always``, ``never``).
        batch_seconds: time each backfill batch aims at (how long its rows stay locked), seconds.
        install_pgmq: install the bundled PGMQ SQL when missing, under the migrators' lock.
        assume_release: ``--assume-release``: the release the operator asserts for an unrecognised
            upstream schema (recorded with the adoption).
        fill_history: ``--fill-history``: after the migrations, store the step outputs of runs that
            finished before an online adoption (the history backfill; online, resumable). Off by
            default: ``get_run_with_states`` computes them (migration 0003).

    Returns:
        A :class:`MigrateResult` with one phase per step (the preflight, the adoption, each migration,
        the history backfill).

    Raises:
        StateConflict, ConnectionFailed, SchemaMissing, LockTimeout: see :func:`pgflow_cli.installer.apply`;
            StateConflict also for an unrecognised upstream schema without ``assume_release``.
        UsageError: ``assume_release`` is not a release pgflow-cli knows.
    """
    installer.check_writable(conn)  # a standby or read-only session: say so before the preflight
    emit = progress or (lambda event: None)
    result = MigrateResult(dry_run=dry_run)
    found = upstream.inspect(conn, assume_release=assume_release)
    adopting = found.adoption_pending
    plan = installer.make_plan(conn)
    conflict = blocking_conflict(plan, found)
    if conflict:
        raise conflict
    pending = [m for m in plan.pending if (target_version is None or m.version <= target_version)
               and not (adopting and m.version <= installer.BASELINE_VERSION)]
    if dry_run and plan.in_progress:
        first = plan.in_progress[0]
        raise StateConflict(
            f"migration {first.version:04d} is in progress (phased); a dry run replays a migration from its "
            "start, which cannot work on a partly applied one",
            hint=f"resume it with `pgflow migrate apply`, or undo it with `pgflow migrate abort {first.version}`",
        )
    changes = [m for m in pending if not plan.converts(m)]  # a conversion changes no table and no protocol
    checked = preflight(conn, changes)
    if checked is not None:
        result.phases.append(Phase("preflight audit", checked.seconds,
                                   {"findings": checked.findings, "blocking": checked.blocking}))
        emit(PreflightPassed(checked.findings, checked.blocking))
    workers: dict[str, int] | None
    if adopting:
        protocols = [m.worker_protocol for m in pending if m.worker_protocol]
        workers = {**upstream.live_workers(conn), "enabled_functions": 0, "protocol": max(protocols or [1])}
    else:
        workers = live_workers(conn, changes)
    if workers is not None:
        result.protocol_change = workers
        if workers["alive"] or workers["enabled_functions"]:
            emit(WorkersAlive(workers["alive"], workers["functions"], workers["enabled_functions"], workers["protocol"]))
    steps = upstream.steps_before_migrations(found, assume_release=assume_release, dry_run=dry_run)
    if not (dry_run and adopting):  # the migrations after the baseline need the adoption committed
        steps.append(installer.Migrations(target_version))
    if fill_history and not dry_run:
        # last, after the migrations committed (workers need not wait for it), only when asked
        steps.append(upstream.history_step())
    options = installer.Options(lock_timeout=lock_timeout, attempts=attempts, dry_run=dry_run, online=online,
                                batch_seconds=batch_seconds, install_pgmq=install_pgmq, measure=True)

    def on_blockers(blockers: list[dict[str, Any]], waiting: dict[str, Any] | None) -> None:
        emit(Blocked(tuple(blockers), waiting))

    with LockWatcher(target, conn.info.backend_pid, on_blockers) as watcher:
        try:
            outcomes = installer.run(conn, steps, options, emit)
        except LockTimeout as exc:
            exc.detail.extend(f"blocked by {describe_blocker(b)}" for b in watcher.seen)
            raise
    for outcome in outcomes:
        result.add(outcome)
    result.blockers_seen = [dict(b) for b in watcher.seen]
    return result


def abort(conn: psycopg.Connection, version: int) -> str:
    """Undo the committed phases of in-progress migration ``version`` (:func:`pgflow_cli.installer.abort`).

    Returns:
        The migration's label (``NNNN_name``).

    Raises:
        StateConflict: it is not in progress or has no abort phase (exit 6).
    """
    return installer.abort(conn, version).label

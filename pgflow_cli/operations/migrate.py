"""``pgflow migrate``: show, plan and apply the shipped migrations safely.

Applying is :func:`pgflow_cli.installer.apply` (the one installer) plus what an operator
needs around it:

* a **preflight audit** before any lock is taken (for migrations marked ``--@preflight
  audit``): blocking findings refuse the upgrade with the complete list (exit 1) and nothing
  is changed; the migration itself rechecks the same rules under its locks;
* a **lock watcher**: a second connection that, while the migration waits for a lock,
  names the blocking sessions (pid, application name, state, seconds) without their
  query text;
* bounded **retries** on lock timeouts and deadlocks only, with backoff;
* **dry runs**: each pending migration runs and is rolled back, reporting rows touched
  per table and the relation locks it held (and for how long: every lock is held until the
  end of its transaction).
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
from pgflow_cli.errors import ExitCode, LockTimeout, PgflowError, Refused, StateConflict
from pgflow_cli.operations import upstream

QUERIES = "queries/migrate.sql"
Progress = Callable[[str, dict[str, Any]], None]


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


@dataclass
class StatusReport:
    """The truth about one database's migrations, for ``pgflow migrate status`` and after Ctrl-C.

    Attributes:
        plan: the installer's comparison of the shipped files with the ledger.
        verdict: ``conflict`` (changed checksum, newer database, foreign pgflow: nothing can be
            applied), ``in_progress`` (a phased run stopped part way), ``drift`` (installed
            function text differs from the files, or an invalid index is left, with nothing
            pending to fix it), ``pending`` (migrations, or the online completion of an
            adoption: its index and validations) or ``up_to_date`` (an optional history
            backfill may be left: a note says so).
        conflict: the error ``migrate apply`` would refuse with (``verdict == "conflict"``): an
            unrecognised upstream schema, or the ledger's conflict when nothing is to be adopted.
        found: which release installed a pgflow schema pgflow-cli did not (or adopted), and what
            adopting it involves (:func:`pgflow_cli.operations.upstream.inspect`).
    """

    plan: installer.Plan
    verdict: str
    conflict: PgflowError | None
    found: upstream.UpstreamPlan | None = None

    @property
    def exit_code(self) -> ExitCode:
        """0 up to date or only pending; 1 in progress or drift (operator work); 6 conflict (docs/exit-codes.md)."""
        if self.verdict == "conflict":
            return ExitCode.CONFLICT
        if self.verdict in ("in_progress", "drift"):
            return ExitCode.FINDINGS
        return ExitCode.OK

    def lines(self) -> list[str]:
        """What is true, one sentence a line, each with the command that moves on from it."""
        plan = self.plan
        out = []
        for s in plan.in_progress:
            done = ", ".join(s.recorded.phases_done) if s.recorded and s.recorded.phases_done else "none"
            out.append(f"migration {s.version:04d}_{s.name} is IN PROGRESS (committed phases: {done}); the database "
                       f"keeps its old behaviour until the last phase commits: resume with `pgflow migrate apply`, "
                       f"or undo with `pgflow migrate abort {s.version}`")
        for index in plan.invalid_indexes:
            out.append(f"index {index} is INVALID (left by an interrupted concurrent build); `pgflow migrate apply` "
                       "drops and rebuilds it")
        for f in plan.file_drift:
            what = "is not installed" if f.state == "missing" else "is installed with another definition"
            out.append(f"function file sql/{f.path} {what} ({'; '.join(f.detail)}): the database differs from this "
                       "tool's file and no migration is pending")
        pending = [s for s in plan.statuses if s.state == "pending"]
        if self.verdict == "conflict":
            out.append("NOT up to date: this tool cannot migrate this database (see the error below)")
        elif plan.conversion is not None:
            out.append(conversion_sentence(plan) + "; next: pgflow migrate plan")
        elif pending and self.found is not None and self.found.adoption_pending:
            out.append(f"{len(pending)} pending, the baseline through adoption; next: pgflow migrate plan")
        elif pending:
            out.append(f"{len(pending)} pending ({', '.join(f'{s.version:04d}' for s in pending)}); "
                       "next: pgflow migrate plan")
        elif self.found is not None and self.found.completion:
            out.append("migrations up to date; the adoption is not finished: "
                       + "; ".join(self.found.steps) + "; next: pgflow migrate apply")
        elif self.verdict == "up_to_date":
            out.append("up to date")
        return out

    def to_dict(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "verdict": self.verdict,
            "pending": [m.version for m in plan.pending],
            "in_progress": [{"version": s.version, "phases_done": list(s.recorded.phases_done) if s.recorded else []}
                            for s in plan.in_progress],
            "changed": [s.version for s in plan.changed],
            "unknown": [s.version for s in plan.unknown],
            "invalid_indexes": list(plan.invalid_indexes),
            "files": [f.to_dict() for f in plan.files],
            "file_drift": [f.path for f in plan.file_drift],
            "installed": self.found.recognition.summary() if self.found else None,
            "upstream": self.found.to_dict() if self.found else None,
            "conflict": self.conflict.to_dict() if self.conflict else None,
        }


def conversion_sentence(plan: installer.Plan) -> str:
    """What ``apply`` does with an earlier build's ledger rows 0003-0016 (:attr:`installer.Plan.conversion`)."""
    first = plan.pending[0]
    return (f"the ledger records migrations 0003-0016 of pgflow-cli {installer.old_levels.OLD_BUILD}: `pgflow migrate "
            f"apply` records them as {first.label} in one transaction, after a catalog comparison proves the schema "
            "is theirs (functions and grants of the stage replaced, no table scanned or altered)")


def blocking_conflict(plan: installer.Plan, found: upstream.UpstreamPlan) -> PgflowError | None:
    """What stops ``apply`` here: a foreign ``pgflow.schema_migrations`` or a partial pgflow schema
    (no ``pgflow.flows``: not a release's schema either), else an unrecognised upstream schema,
    else the ledger's conflicts; a recognised upstream schema (or one whose release is asserted)
    is adopted instead.

    Args:
        plan: :func:`pgflow_cli.installer.make_plan` of the database.
        found: :func:`pgflow_cli.operations.upstream.inspect` of the same database.

    Returns:
        The error ``migrate apply`` would refuse with (exit 6), or ``None``.
    """
    if plan.state.foreign_ledger or plan.state.partial_pgflow:
        return plan.refuse_reasons()
    refused = upstream.refusal(found)
    if refused is not None:
        return refused  # type: ignore[return-value]
    if found.adoption_pending:
        return None
    return plan.refuse_reasons()


def status(conn: psycopg.Connection) -> StatusReport:
    """Read the ledger, the function-file records, invalid indexes and which release installed the
    schema (read-only) and judge them.

    Returns:
        A :class:`StatusReport`; its ``exit_code`` is what ``migrate status`` exits with.
    """
    plan = installer.make_plan(conn)
    found = upstream.inspect(conn)
    conflict = blocking_conflict(plan, found)
    if conflict:
        verdict = "conflict"
    elif plan.in_progress:
        verdict = "in_progress"
    elif plan.file_drift or plan.invalid_indexes:
        verdict = "drift"
    elif plan.pending or found.completion:
        verdict = "pending"
    else:
        verdict = "up_to_date"
    return StatusReport(plan, verdict, conflict, found)


def interrupted(target: Target) -> PgflowError:
    """The error to report after Ctrl-C during ``migrate apply``: what state the database was left in.

    Reads the state over a new connection (the migrator's own connection was closed, which also
    released its migrator lock). Never raises: when the state cannot be read the message says so.

    Returns:
        A :class:`PgflowError` with exit code 130 (INTERRUPTED), the state in its detail and how
        to resume or abort in its hint.
    """
    try:
        conn = connect(target, application_name="pgflow-cli", connect_timeout=5)
        try:
            report = status(conn)
        finally:
            conn.close()
    except (PgflowError, psycopg.Error) as exc:
        return PgflowError("interrupted; the state afterwards could not be read",
                           hint="run `pgflow migrate status` to see what was applied", detail=[str(exc).splitlines()[0]],
                           exit_code=ExitCode.INTERRUPTED)
    plan = report.plan
    if plan.in_progress:
        first = plan.in_progress[0]
        return PgflowError(
            f"interrupted: migration {first.version:04d}_{first.name} is left in progress",
            detail=report.lines(),
            hint=f"resume with `pgflow migrate apply` (it continues after the last committed phase), or undo the "
            f"committed phases with `pgflow migrate abort {first.version}`",
            exit_code=ExitCode.INTERRUPTED)
    applied = [f"{s.version:04d}" for s in plan.statuses if s.state == "applied"]
    if report.found is not None and report.found.history and not report.found.completion and not plan.pending:
        return PgflowError(
            "interrupted while storing the step outputs of finished runs (--fill-history); the migrations are "
            "committed and nothing else is left",
            detail=[f"applied: {', '.join(applied) or 'none'}", *report.lines()],
            hint="rerun `pgflow migrate apply --fill-history` to continue at the recorded page (optional: "
            "get_run_with_states computes those outputs meanwhile)",
            exit_code=ExitCode.INTERRUPTED)
    if report.found is not None and report.found.completion and not plan.pending:
        return PgflowError(
            "interrupted after the migrations committed: the adoption's online completion is not finished",
            detail=[f"applied: {', '.join(applied) or 'none'}", *report.lines()],
            hint="rerun `pgflow migrate apply` to continue where it stopped (nothing else is left to apply)",
            exit_code=ExitCode.INTERRUPTED)
    return PgflowError(
        "interrupted: the migration's open transaction was rolled back; nothing of it was kept",
        detail=[f"applied: {', '.join(applied) or 'none'}", *report.lines()],
        hint="rerun `pgflow migrate apply` when ready" if plan.pending else "",
        exit_code=ExitCode.INTERRUPTED)


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


def preflight(conn: psycopg.Connection, pending: list[installer.Migration]) -> Phase | None:
    """Run the audit's blocking rules before any lock when a pending migration asks for it.

    Returns:
        The ``preflight`` phase (or ``None`` when no pending migration asks for it).

    Raises:
        Refused: blocking findings exist (exit 1), with every one of them in the detail; nothing
            was locked or changed.
    """
    if not any(m.preflight_audit for m in pending):
        return None
    if not installer.read_state(conn).has_flows_table:
        return None  # a fresh install: no definition exists yet, nothing to audit
    from pgflow_cli.operations.audit import run_audit

    started = time.monotonic()
    report = run_audit(conn)
    blocking = report.blocking
    phase = Phase("preflight audit", time.monotonic() - started,
                  {"findings": len(report.findings), "blocking": len(blocking)})
    if blocking:
        raise Refused(
            f"the upgrade is refused: {len(blocking)} blocking finding(s); nothing was locked or changed",
            hint="run `pgflow audit` for the full report and the fix of each finding: a rejected name needs a new "
            "concrete flow under a compliant slug; pgflow never renames or deletes flows",
            detail=[f"{f.check_id}: {f.object_type} {f.object_name}"
                    + (f" (flow {f.flow_slug})" if f.flow_slug and f.flow_slug != f.object_name else "")
                    + f": {f.message}" for f in blocking],
        )
    return phase


def apply(
    conn: psycopg.Connection,
    target: Target,
    *,
    target_version: int | None = None,
    lock_timeout: float = 5.0,
    attempts: int = 5,
    dry_run: bool = False,
    progress: Progress | None = None,
    online: str = "auto",
    batch_seconds: float = 0.2,
    install_pgmq: bool = False,
    assume_release: str | None = None,
    fill_history: bool = False,
) -> MigrateResult:
    """Apply (or dry-run) pending migrations with a lock watcher; see the module docstring.

    A database installed by a published pgflow release (no ledger) is adopted first
    (:mod:`pgflow_cli.operations.upstream`): the preflight audit runs before it, the adoption is
    one transaction under the migrator lock with the same lock timeout and retries, and the
    pending migrations after the baseline follow. In a dry run only the adoption runs (and is
    rolled back): the migrations after it need it committed.

    Args:
        conn: autocommit connection of the migrator.
        target: connection target (the watcher opens its own connection).
        target_version: stop after this migration version.
        lock_timeout: seconds any statement may wait for a lock before the migration is
            rolled back and retried.
        attempts: tries per migration (lock timeouts and deadlocks only).
        dry_run: roll back each migration after measuring it.
        online: phased-migration choice (``auto``, ``always``, ``never``).
        batch_seconds: time each backfill batch aims at (how long its rows stay locked), seconds.
        progress: ``progress(event, data)`` for stderr reporting.
        install_pgmq: install the bundled PGMQ SQL when missing, under the migrator lock.
        assume_release: ``--assume-release``: the release the operator asserts for an unrecognised
            upstream schema (recorded with the adoption).
        fill_history: ``--fill-history``: after the migrations, store the step outputs of runs that
            finished before an online adoption (the history backfill; online, resumable). Off by
            default: ``get_run_with_states`` computes them (migration 0003).

    Returns:
        A :class:`MigrateResult` with one phase per migration (and one for the adoption).

    Raises:
        StateConflict, ConnectionFailed, SchemaMissing, LockTimeout: see :func:`pgflow_cli.installer.apply`;
            StateConflict also for an unrecognised upstream schema without ``assume_release``.
        UsageError: ``assume_release`` is not a release pgflow-cli knows.
    """
    installer.check_writable(conn)  # a standby or read-only session: say so before the preflight
    emit = progress or (lambda event, data: None)
    result = MigrateResult(dry_run=dry_run)
    pid = conn.info.backend_pid
    starts: dict[str, float] = {}
    measured: dict[str, dict[str, Any]] = {}

    def on_event(event: str, data: dict[str, Any]) -> None:
        if event == "start":
            starts[data["migration"]] = time.monotonic()
        if event == "done":
            label = data["migration"]
            detail = {"migration": label, "attempts": data["attempts"], "duration_ms": data["duration_ms"]}
            detail.update(measured.get(label, {}))
            result.phases.append(Phase(f"apply {label}", time.monotonic() - starts.get(label, time.monotonic()), detail))
            if not dry_run:
                result.applied.append(label)
        emit(event, data)

    def measure(c: psycopg.Connection, migration: installer.Migration | str) -> None:
        label = migration if isinstance(migration, str) else migration.label
        with c.cursor(row_factory=dict_row) as cur:
            changes = cur.execute(sqlfiles.statement(QUERIES, "transaction_changes")).fetchall()
            locks = cur.execute(sqlfiles.statement(QUERIES, "transaction_locks")).fetchall()
        held_ms = int((time.monotonic() - starts.get(label, time.monotonic())) * 1000)
        measured[label] = {
            "rows_touched": changes,
            "locks_held": [{**lock, "held_ms": held_ms} for lock in locks],
        }

    def on_blockers(blockers: list[dict[str, Any]], waiting: dict[str, Any] | None) -> None:
        emit("blocked", {"blockers": blockers, "waiting_on": waiting})

    found = upstream.inspect(conn, assume_release=assume_release)
    adopting = found.adoption_pending
    plan = installer.make_plan(conn)
    conflict = blocking_conflict(plan, found)
    if conflict:
        raise conflict
    pending = [m for m in plan.pending if (target_version is None or m.version <= target_version)
               and not (adopting and m.version <= installer.BASELINE_VERSION)]
    in_progress = [s for s in plan.statuses if s.state == "in_progress"]
    if dry_run and in_progress:
        raise StateConflict(
            f"migration {in_progress[0].version:04d} is in progress (phased); a dry run replays a migration from its "
            "start, which cannot work on a partly applied one",
            hint=f"resume it with `pgflow migrate apply`, or undo it with `pgflow migrate abort {in_progress[0].version}`",
        )
    steps = [m for m in pending if not plan.converts(m)]  # a conversion changes no table and no protocol
    checked = preflight(conn, steps)
    if checked is not None:
        result.phases.append(checked)
        emit("preflight", checked.detail)
    workers: dict[str, int] | None
    if adopting:
        protocols = [m.worker_protocol for m in pending if m.worker_protocol]
        workers = {**upstream.live_workers(conn), "enabled_functions": 0, "protocol": max(protocols or [1])}
    else:
        workers = live_workers(conn, steps)
    if workers is not None:
        result.protocol_change = workers
        if workers["alive"] or workers["enabled_functions"]:
            emit("workers_alive", workers)
    if adopting or found.completion:
        from pgflow_cli.upstream.adopt import adoption_label

        label = adoption_label(found.recognition)
        with LockWatcher(target, pid, on_blockers) as watcher, installer.migrator_lock(conn, progress=emit):
            try:
                outcome = upstream.run(conn, found, assume_release=assume_release, lock_timeout=lock_timeout,
                                       attempts=attempts, dry_run=dry_run, online=online, batch_seconds=batch_seconds,
                                       progress=on_event, before_commit=lambda c: measure(c, label))
            except LockTimeout as exc:
                exc.detail.extend(f"blocked by {describe_blocker(b)}" for b in watcher.seen)
                raise
        if adopting and outcome is not None and not isinstance(outcome, int):
            result.adoption = {"release": outcome.release, "releases": list(outcome.releases),
                               "assumed": outcome.assumed, "differences": outcome.differences,
                               "online": outcome.online, "dry_run": outcome.dry_run}
        if dry_run and adopting:
            return result  # the migrations after the baseline need the adoption committed
    with LockWatcher(target, pid, on_blockers) as watcher:
        try:
            installer.apply(
                conn,
                target=target_version,
                lock_timeout=lock_timeout,
                attempts=attempts,
                progress=on_event,
                before_commit=measure,
                dry_run=dry_run,
                online=online,
                batch_seconds=batch_seconds,
                install_pgmq=install_pgmq,
            )
        except LockTimeout as exc:
            exc.detail.extend(f"blocked by {describe_blocker(b)}" for b in watcher.seen)
            raise
    result.blockers_seen = [dict(b) for b in watcher.seen]
    if fill_history and not dry_run and upstream.history_left(conn):
        # Last, after the migrations committed (workers need not wait for it), only when asked: the
        # outputs of runs that finished before an online adoption, in short batches, resumable; one
        # migrator at a time.
        started = time.monotonic()
        with installer.migrator_lock(conn, progress=emit):
            if upstream.finish_history(conn, lock_timeout=lock_timeout, attempts=attempts,
                                       batch_seconds=batch_seconds, progress=emit):
                result.phases.append(Phase("history backfill (adoption, online)", time.monotonic() - started))
    return result


# --------------------------------------------------------------------------------------------
# what `migrate status` and `migrate plan` show, `migrate apply --sql`, `migrate abort`
# --------------------------------------------------------------------------------------------


def summary(migration: installer.Migration) -> str:
    """The header sentence of a migration file (its first comment paragraph, up to the first period
    at the end of a line), without the ``-- NNNN`` prefix; the name in words when it has none."""
    parts: list[str] = []
    for line in migration.sql.splitlines():
        if not line.startswith("--") or line.startswith("--@"):
            break
        text = line[2:].strip()
        if not text:
            break
        parts.append(text)
        if text.endswith("."):
            break
    joined = " ".join(parts)
    prefix = f"{migration.version:04d} "
    joined = joined[len(prefix):] if joined.startswith(prefix) else joined
    return joined or migration.name.replace("_", " ")


def status_rows(plan: installer.Plan) -> list[dict[str, Any]]:
    """One row per migration for ``migrate status`` (JSON ``migrations``, CSV, tables).

    Returns:
        Dicts with ``version`` (int), ``name``, ``label`` (``NNNN_name``), ``state`` (``applied``,
        ``pending``, ``in_progress``, ``changed``, ``unknown``, ``superseded``), ``summary``, ``applied_at``
        (datetime, UTC, or None), ``applied_by``, ``tool_version``, ``duration_ms`` (int ms),
        ``duration_seconds`` (float s), ``checksum`` (hex).
    """
    import datetime as dt

    by_version = {m.version: m for m in installer.available_migrations()}
    rows = []
    for s in plan.statuses:
        recorded = s.recorded
        applied_at = recorded.applied_at if recorded else None
        if isinstance(applied_at, dt.datetime):
            applied_at = applied_at.astimezone(dt.timezone.utc)
        duration_ms = recorded.duration_ms if recorded else None
        rows.append({
            "version": s.version,
            "name": s.name,
            "label": f"{s.version:04d}_{s.name}",
            "state": s.state,
            "summary": (f"pgflow-cli {installer.old_levels.OLD_BUILD}'s migration, replaced by one migration "
                        f"({by_version[installer.old_levels.FIRST].label})") if s.state == "superseded"
            else summary(by_version[s.version]) if s.version in by_version else "",
            "applied_at": applied_at,
            "applied_by": recorded.applied_by if recorded else None,
            "tool_version": recorded.tool_version if recorded else None,
            "duration_ms": duration_ms,
            "duration_seconds": None if duration_ms is None else round(duration_ms / 1000, 3),
            "checksum": s.file_checksum or (recorded.checksum if recorded else None),
        })
    return rows


@dataclass
class PlanReport:
    """What ``migrate apply`` would do here, and what can be run next (``migrate plan``).

    Attributes:
        plan: the installer's comparison of files and ledger.
        found: what installed the schema and what adopting it involves.
        conflict: what stops ``apply`` (exit 6), or ``None``.
        refused: the preflight audit's refusal (exit 1), or ``None``.
        pending: one dict per migration apply runs: ``version``, ``name``, ``summary``, ``checksum``,
            ``state``, ``path`` (one transaction / phased, in words), ``preflight_audit`` (bool),
            ``worker_protocol`` (int or None).
        pgmq_installed: ``pgmq.meta`` exists.
        next: commands that will succeed in this state (without the target option; the CLI adds
            it), e.g. ``pgflow migrate apply --dry-run``: in order, or alternatives when ``choice``.
        notes: sentences to show with them.
        choice: ``next`` lists alternatives (resume or abort), not steps.
    """

    plan: installer.Plan
    found: upstream.UpstreamPlan
    conflict: PgflowError | None
    refused: PgflowError | None
    pending: list[dict[str, Any]]
    pgmq_installed: bool
    next: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    choice: bool = False

    @property
    def problem(self) -> PgflowError | None:
        """The conflict or the refusal (what the command exits with), or ``None``."""
        return self.conflict or self.refused

    def to_dict(self) -> dict[str, Any]:
        return {
            "upstream": self.found.to_dict(),
            "pending": self.pending,
            "pgmq_installed": self.pgmq_installed,
            "conflict": self.conflict.to_dict() if self.conflict else None,
            "refused": self.refused.to_dict() if self.refused else None,
            "next": self.next,
            "next_is_choice": self.choice,
            "notes": self.notes,
        }


def make_plan(conn: psycopg.Connection, *, assume_release: str | None = None) -> PlanReport:
    """Plan ``migrate apply`` (read-only): the pending migrations and their paths, the preflight audit,
    and the commands that will succeed next in this state.

    The suggestions follow the state: a conflict or a refusal suggests nothing that would fail (the
    audit for a refusal); a migration in progress suggests resuming or aborting it (a dry run cannot
    replay it); a database without PGMQ suggests installing it (``--install-pgmq``, which cannot be
    combined with ``--dry-run``); otherwise a dry run, then the apply.

    Returns:
        A :class:`PlanReport`.
    """
    the_plan = installer.make_plan(conn)
    found = upstream.inspect(conn, assume_release=assume_release)
    conflict = blocking_conflict(the_plan, found)
    upstream_schema = found.recognition.status in ("upstream", "unrecognised")
    todo = [m for m in the_plan.pending if not (upstream_schema and m.version <= installer.BASELINE_VERSION)]
    refused: PgflowError | None = None
    if not conflict:
        try:
            preflight(conn, [m for m in todo if not the_plan.converts(m)])
        except Refused as exc:
            refused = exc
    states = {s.version: s.state for s in the_plan.statuses if s.state != "superseded"}
    pending = [{"version": m.version, "name": m.name, "summary": summary(m), "checksum": m.checksum,
                "state": states.get(m.version, "pending"), "path": _path(conn, the_plan, m),
                "preflight_audit": m.preflight_audit and not the_plan.converts(m),
                "worker_protocol": None if the_plan.converts(m) else m.worker_protocol}
               for m in todo]
    report = PlanReport(the_plan, found, conflict, refused, pending, the_plan.state.has_pgmq_meta)
    work = bool(pending or found.steps)
    in_progress = [p for p in pending if p["state"] == "in_progress"]
    if conflict:
        pass
    elif refused:
        report.next = ["pgflow audit"]
        report.notes.append("fix the blocking findings `pgflow audit` lists, then plan again")
    elif in_progress:
        version = in_progress[0]["version"]
        report.next = ["pgflow migrate apply", f"pgflow migrate abort {version}"]
        report.choice = True
        report.notes.append(f"{version:04d} is in progress: `apply` resumes it after its last committed phase, "
                            "`abort` undoes its committed phases (a dry run cannot replay a partly applied migration)")
    elif work and not report.pgmq_installed:
        report.next = ["pgflow migrate apply --install-pgmq"]
        report.notes.append("PGMQ is not installed: install the pgmq extension (CREATE EXTENSION pgmq) and plan "
                            "again, or let apply install the PGMQ SQL bundled with pgflow-cli (--install-pgmq; "
                            "a dry run needs PGMQ first)")
    elif work:
        report.next = ["pgflow migrate apply --dry-run", "pgflow migrate apply"]
    return report


def _path(conn: psycopg.Connection, plan: installer.Plan, migration: installer.Migration) -> str:
    """How ``apply`` runs ``migration`` here, in words (``migrate plan``)."""
    if plan.converts(migration):
        return (f"conversion of 0003-0016 of pgflow-cli {installer.old_levels.OLD_BUILD} (one transaction: a catalog "
                "comparison, then the stage's functions and grants; no table scanned or altered)")
    return migration.phased.path(conn) if migration.phased else "one transaction"


def abort(conn: psycopg.Connection, version: int) -> str:
    """Undo the committed phases of in-progress migration ``version`` (:func:`pgflow_cli.installer.abort`).

    Returns:
        The migration's label (``NNNN_name``).

    Raises:
        StateConflict: it is not in progress or has no abort phase (exit 6).
    """
    return installer.abort(conn, version).label


BATCH_ALL_PAGES = {"first_page": 0, "pages": 4294967294}
"""Parameters that make one call of a ``batch`` phase cover the whole heap (block numbers are 32-bit)."""


@dataclass
class Script:
    """``migrate apply --sql``: SQL that psql runs as is, or the reason it cannot be printed.

    Attributes:
        text: the script (empty when nothing is pending).
        notes: what the operator should know (stderr), one sentence each.
    """

    text: str
    notes: list[str] = field(default_factory=list)


def sql_script(conn: psycopg.Connection, *, target_version: int | None = None, assume_release: str | None = None,
               online: str = "auto", lock_timeout: float = 5.0) -> Script:
    """The pending migrations as one psql script: what ``migrate apply`` runs on its one-transaction path.

    Each migration is one ``BEGIN ... COMMIT`` holding the migrator's advisory lock, the local
    ``lock_timeout``, its table locks (taken first, in the lock order), every phase apply runs on
    that path (marked ``-- phase NAME`` comments; ``notx`` phases are left out as apply leaves them
    out, a ``batch`` backfill runs once over the whole table), and its ledger rows, with every value
    written in: no placeholder, no abort phase. ``psql -v ON_ERROR_STOP=1 -f script.sql`` runs it.

    Raises:
        StateConflict: what stops ``apply`` (exit 6), or a migration in progress: its remaining
            phases run only phase by phase, which cannot be printed as one script.
        UsageError: ``online="always"``: the phased path cannot be printed as one script (exit 2).
    """
    from psycopg import ClientCursor

    from pgflow_cli import __version__
    from pgflow_cli.errors import UsageError

    plan = installer.make_plan(conn)
    found = upstream.inspect(conn, assume_release=assume_release)
    conflict = blocking_conflict(plan, found)
    if conflict:
        raise conflict
    if online == "always":
        raise UsageError(
            "the phased path cannot be printed as one script: it commits phase by phase, sizes its backfill "
            "batches while it runs and builds an index CONCURRENTLY outside any transaction",
            hint="--sql prints the one-transaction path (--online auto or never); run the phased path with "
            "`pgflow migrate apply --online always`")
    if plan.in_progress:
        first = plan.in_progress[0]
        raise StateConflict(
            f"migration {first.version:04d}_{first.name} is in progress: its remaining phases run only phase by "
            "phase, which cannot be printed as one script",
            hint=f"resume it with `pgflow migrate apply`, or undo it with `pgflow migrate abort {first.version}`")
    notes: list[str] = []
    if found.adoption_pending:
        review = upstream.sql_script(conn, found)
        notes.append("this database was installed by a pgflow release: its adoption cannot be printed as a script "
                     "psql runs as is (the driver adds backfills, validations and ledger rows around it); the text "
                     "below is commented out, for review only; adopt it with `pgflow migrate apply`, then "
                     "`--sql` prints the migrations after it")
        commented = "\n".join(f"-- {line}" if line else "--" for line in review.rstrip("\n").splitlines())
        return Script(f"-- FOR REVIEW ONLY (not runnable as is): {found.steps[0]}\n{commented}\n", notes)
    todo = [m for m in plan.pending if target_version is None or m.version <= target_version]
    if not todo:
        return Script("", ["nothing pending"])
    if not plan.state.has_pgmq_meta:
        notes.append("PGMQ is not installed: psql stops at the first migration until it is (CREATE EXTENSION pgmq), "
                     "or use `pgflow migrate apply --install-pgmq`")
    if plan.converts(todo[0]):
        return _conversion_script(plan, todo[0], notes)
    out = [f"-- pgflow-cli {__version__}: `pgflow migrate apply` on its one-transaction path, as a psql script.",
           "-- Run it with: psql -v ON_ERROR_STOP=1 -f this-file.sql (each migration is one transaction).",
           "\\set ON_ERROR_STOP on", ""]
    with ClientCursor(conn) as cur:
        for migration in todo:
            phases = migration.phases_for_single_transaction()
            if migration.phased and migration.phased.large(conn) and online == "auto":
                notes.append(f"{migration.label}: `apply` would take the phased path here (large table); this script "
                             "is the one-transaction path, which holds its locks for the whole migration")
            out.append(f"-- ===== {migration.label} (sha256 {migration.checksum}) =====")
            out.append("BEGIN;")
            out.append(_statement(sqlfiles.statement(installer.QUERIES, "migrator_xact_lock")))
            out.append(_statement(cur.mogrify(sqlfiles.statement(installer.QUERIES, "local_lock_timeout"),
                                              {"value": f"{max(1, int(lock_timeout * 1000))}ms"})))
            template = sqlfiles.statement(installer.QUERIES, "lock_table")
            for lock in migration.locks_for([None, *(p.name for p in phases)]):
                schema, table = lock.table.split(".")
                statement = psycopg.sql.SQL(template).format(
                    table=psycopg.sql.Identifier(schema, table), mode=psycopg.sql.SQL(lock.mode))
                out.append(_statement(statement.as_string(conn)))
            skipped = [p.name for p in (migration.phased.apply_phases if migration.phased else ()) if p.mode == "notx"]
            for phase in phases:
                if migration.phased:
                    out.append(f"-- phase {phase.name} ({phase.mode})")
                if phase.mode == "batch":
                    out.append(_statement(cur.mogrify(phase.sql, BATCH_ALL_PAGES)))
                else:
                    out.append(_statement(phase.sql))
            for name in skipped:
                out.append(f"-- phase {name} (notx) is left out on this path, as `apply` leaves it out")
            out.append("-- the ledger rows (what `apply` records in the same transaction)")
            out.append(_statement(sqlfiles.statement(installer.QUERIES, "ledger_bootstrap")))
            out.append(_statement(cur.mogrify(sqlfiles.statement(installer.QUERIES, "ledger_record"), {
                "version": migration.version, "name": migration.name, "checksum": migration.checksum,
                "tool_version": __version__, "duration_ms": 0, "state": "applied", "phases_done": []})))
            out.append("COMMIT;")
            out.append("")
    return Script("\n".join(out), notes)


def _conversion_script(plan: installer.Plan, migration: installer.Migration, notes: list[str]) -> Script:
    """The conversion of an earlier build's ledger as text to review, commented out: it cannot run as
    a script, because it starts with a comparison of the catalog with the frozen schema of level 16
    that the tool makes (a script would change the ledger of a database it never checked)."""
    notes.append(conversion_sentence(plan) + ". It cannot be printed as a script psql runs as is: it first "
                 "compares the catalog with the schema those migrations leave, which only the tool does (a script "
                 "would rewrite the ledger of a database nobody checked); the text below is commented out, for "
                 "review only. Convert with `pgflow migrate apply`; `--sql` prints the migrations after it")
    review = "\n".join([
        f"-- {migration.label}: the conversion of migrations 0003-0016 of pgflow-cli {installer.old_levels.OLD_BUILD}",
        "-- 1. the catalog comparison (in the tool), 2. the stage's functions:",
        migration.section("functions"),
        "-- 3. its grants:",
        migration.section("grants"),
        "-- 4. the functions of level 16 it did not create again are dropped; the per-file ledger goes:",
        sqlfiles.statement(installer.QUERIES, "drop_file_ledger") + ";",
        "-- 5. ledger rows 0003-0016 become one row of " + migration.label,
    ])
    commented = "\n".join(f"-- {line}" if line else "--" for line in review.splitlines())
    return Script(f"-- FOR REVIEW ONLY (not runnable as is): convert with `pgflow migrate apply`\n{commented}\n", notes)


def _statement(text: str) -> str:
    """One statement of a script, ended by exactly one semicolon (on its own line after a comment)."""
    body = text.rstrip().rstrip(";").rstrip()
    return body + ("\n;" if "--" in body.splitlines()[-1] else ";")

"""Adopt a schema that a published pgflow release installed: bring it to pgflow-cli's baseline in place.

The adoption is one transaction of three parts, all shipped SQL:

1. ``sql/adoption/schema.sql``: locks the tables, drops the functions pgflow-cli's baseline
   replaces (remembering their grants), adds the missing columns, constraints and index with
   the baseline's names, types and defaults, and backfills step outputs where the release did
   not store them (what 0.13.0 did);
2. pgflow-cli's baseline functions, from the very files the baseline migrations run
   (:func:`baseline_function_sql`): no second copy of any function exists;
3. ``sql/adoption/finish.sql``: the slug checks again, the remembered grants on the new
   functions (nothing else granted), PUBLIC revoked, and the adoption record;

then the ledger rows of migrations 0001 and 0002, so the installer continues with 0003 as on
any baseline database. Every row of every table is kept. A lock timeout or deadlock rolls the
whole transaction back and it is retried; a killed client leaves the database as it was.

On a large database (:data:`ONLINE_THRESHOLD_BYTES`) the transaction backfills only the step
outputs the runtime reads (runs in flight); the index, the constraint validations and, last,
the **history backfill** (the stored outputs of finished runs; ``get_run_with_states``
computes them from their tasks since migration 0003) run after the commit in short
transactions, recorded in ``pgflow.schema_adoption.pending`` so a rerun resumes. ``pgflow
migrate apply`` runs the history backfill only with ``--fill-history``, after the migrations
(:func:`complete` with ``history``).

Spec: issue 8 "Adoption"; fact sheet ``upstream-releases.md`` §4.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import ClientCursor
from psycopg import sql as pgsql
from psycopg.types.json import Jsonb

from pgflow_cli import __version__, sqlfiles
from pgflow_cli.db import first_line, retry_on_lock, scalar, transaction
from pgflow_cli.errors import StateConflict
from pgflow_cli.installer import MAX_BATCH_PAGES, Migration, TableLock, locked_transaction
from pgflow_cli.upstream import recognise as rec
from pgflow_cli.upstream.releases import REPLACED_BY

QUERIES = "queries/adopt.sql"
INSTALLER_QUERIES = "queries/installer.sql"
SCHEMA_FILE = "adoption/schema.sql"
FINISH_FILE = "adoption/finish.sql"

ProgressFn = Callable[[str, dict[str, Any]], None]

ADOPTION_LOCKS = tuple(TableLock(f"pgflow.{table}", "ACCESS EXCLUSIVE") for table in (
    "flows", "steps", "deps", "runs", "step_states", "step_tasks", "workers", "worker_functions"))
"""What the adoption transaction locks before its SQL runs, all or none
(:func:`pgflow_cli.installer.take_locks`); ``worker_functions`` only where the
release has it. ``sql/adoption/schema.sql`` locks the same tables again (already held) so its text
also stands alone in ``--sql``."""


def adoption_locks(conn: psycopg.Connection) -> tuple[TableLock, ...]:
    """:data:`ADOPTION_LOCKS` for this database (without ``pgflow.worker_functions`` when the release
    that installed it has no such table)."""
    row = conn.execute(sqlfiles.statement(QUERIES, "has_worker_functions")).fetchone()
    has_worker_functions = bool(row and row[0])
    return tuple(lock for lock in ADOPTION_LOCKS if has_worker_functions or lock.table != "pgflow.worker_functions")

_FUNCTION_STATEMENT = re.compile(r"^CREATE FUNCTION pgflow\.[\s\S]*?\bAS \$\$[\s\S]*?\$\$;", re.MULTILINE)
_FUNCTION_NAME = re.compile(r"^CREATE (?:OR REPLACE )?FUNCTION pgflow\.([a-z_][a-z0-9_]*)\(", re.MULTILINE)


def _baseline_migrations() -> list[Migration]:
    from pgflow_cli import installer

    return [m for m in installer.available_migrations() if m.version <= installer.BASELINE_VERSION]


def baseline_function_sql() -> str:
    """pgflow-cli's baseline function definitions, exactly as the baseline migrations create them.

    Every ``CREATE FUNCTION`` statement of the schema migration (0001 holds the tables and
    two functions) followed by the whole runtime migration (0002 creates functions only).

    Returns:
        SQL text (several statements).
    """
    schema, runtime = _baseline_migrations()
    return "\n\n".join(_FUNCTION_STATEMENT.findall(schema.sql)) + "\n\n" + runtime.sql


def baseline_function_names() -> tuple[str, ...]:
    """Names of the functions :func:`baseline_function_sql` creates, sorted."""
    return tuple(sorted(set(_FUNCTION_NAME.findall(baseline_function_sql()))))


OPTIONAL_FILES = {"prune_data_older_than": "optional/prune_baseline.sql"}
"""pgflow-cli's version of each optional function pgflow's docs ship (installed only where one was)."""


def replaced_functions(optional: tuple[str, ...] = ()) -> dict[str, str | None]:
    """``{function name: replacing name or None}``: what part 1 drops (any signature).

    Every function named like one of the baseline's (``None``: replaced by its namesake), the
    upstream functions the baseline replaces under another name (:data:`REPLACED_BY`), and the
    installed optional functions (``optional``, replaced by :data:`OPTIONAL_FILES`).
    """
    names: dict[str, str | None] = {name: None for name in baseline_function_names()}
    names.update(REPLACED_BY)
    names.update({name: None for name in optional})
    return names


@dataclass(frozen=True)
class AdoptionPart:
    """One part of the adoption transaction, for ``--sql`` and progress.

    Attributes:
        label: ``adoption/schema.sql``, ``baseline functions`` ...
        sql: the text executed.
    """

    label: str
    sql: str


def adoption_parts(conn: psycopg.Connection, recognition: rec.Recognition) -> list[AdoptionPart]:
    """The statements of the adoption, in order, as they are executed (``--sql`` prints them).

    ``conn`` is used only to quote the list of replaced functions (no query is sent).
    """
    replaced = replaced_functions(recognition.optional)
    cursor = ClientCursor(conn)
    rows = cursor.mogrify(sqlfiles.statement(QUERIES, "replaced_rows"),
                          {"names": list(replaced), "replaced_by": list(replaced.values())})
    return [
        AdoptionPart("replaced functions", sqlfiles.statement(QUERIES, "replaced_table") + ";\n" + rows + ";"),
        AdoptionPart(SCHEMA_FILE, sqlfiles.load(SCHEMA_FILE)),
        AdoptionPart("baseline functions (migrations 0001 and 0002)", baseline_function_sql()),
        *[AdoptionPart(OPTIONAL_FILES[name], sqlfiles.load(OPTIONAL_FILES[name])) for name in recognition.optional],
        AdoptionPart(FINISH_FILE, sqlfiles.load(FINISH_FILE)),
    ]


def adoption_checksum(parts: list[AdoptionPart]) -> str:
    """SHA-256 of the adoption text as executed (recorded with the adoption)."""
    return sqlfiles.checksum("\n".join(p.sql for p in parts))


@dataclass
class Adopted:
    """Outcome of :func:`adopt`.

    Attributes:
        release: the release recorded (the newest member of the recognised group, or the one
            the operator asserted).
        releases: the recognised group.
        assumed: the operator asserted the release (the schema was not recognised).
        differences: what differed from that release (empty when recognised).
        duration_ms: time of the successful attempt's transaction.
        attempts: tries (lock timeouts and deadlocks are retried).
        dry_run: the transaction was rolled back.
        online: the completion ran after the commit (:func:`complete`).
        notices: server notices raised while it ran.
    """

    release: str
    releases: tuple[str, ...]
    assumed: bool
    differences: list[dict[str, Any]]
    duration_ms: int
    attempts: int
    dry_run: bool
    online: bool = False
    notices: list[str] = dataclasses.field(default_factory=list)


class _DryRun(Exception):
    pass


def check_adoptable(recognition: rec.Recognition) -> None:
    """Refuse what adoption must not touch.

    Raises:
        StateConflict: the schema is unrecognised and no release was asserted (exit 6), with
            every difference from the nearest release in ``detail``; or it is not an upstream
            schema at all.
    """
    if recognition.adoptable:
        return
    if recognition.status == rec.UNRECOGNISED:
        raise StateConflict(
            f"this pgflow schema matches no published release: it differs from the nearest, pgflow "
            f"{recognition.label}, in {len(recognition.differences)} place(s)",
            hint="nothing was changed. If you know which release installed it and the differences are yours, "
                 f"rerun with --assume-release {recognition.release} (recorded with the adoption); docs/upgrade.md",
            detail=[d.describe() for d in recognition.differences],
        )
    raise StateConflict(f"nothing to adopt: {recognition.summary()}",
                        hint="`pgflow migrate status` shows what is installed")


HISTORY_STEP = "backfill"
"""The pending completion step of the history backfill (outputs of finished runs), run last."""

ONLINE_THRESHOLD_BYTES = 8 * 1024 * 1024
"""Heap size of step_states + step_tasks above which adoption finishes online (about 40,000
step states: the step output backfill rewrites each completed one, which inside the locked
transaction would block workers for about a second per 50,000 rows)."""

COMPLETION_LABEL = "adoption (online completion)"


def adoption_label(recognition: rec.Recognition) -> str:
    """``adoption of pgflow 0.8.0/0.8.1/0.9.0/0.9.1``: how progress and results name the step."""
    return f"adoption of pgflow {recognition.release if recognition.assumed else recognition.label}"


def large(conn: psycopg.Connection) -> bool:
    """True when the runtime tables are larger than :data:`ONLINE_THRESHOLD_BYTES` (no scan)."""
    row = conn.execute(sqlfiles.statement(QUERIES, "runtime_bytes")).fetchone()
    return bool(row and int(row[0]) > ONLINE_THRESHOLD_BYTES)


def adopt(conn: psycopg.Connection, recognition: rec.Recognition, *, lock_timeout: float = 5.0,
          attempts: int = 5, dry_run: bool = False, progress: ProgressFn | None = None,
          before_commit: Callable[[psycopg.Connection], None] | None = None,
          assume_release: str | None = None, online: str = "auto", batch_seconds: float = 0.2) -> Adopted:
    """Adopt the upstream schema of ``conn``'s database (see the module docstring).

    The adoption itself is one transaction: before it commits the database is the release, after
    it the baseline runtime runs it. On a small database that transaction also checks every
    existing row against the new constraints, builds the new index and backfills every step
    output. On a large one (``online``), it leaves those three for after the commit, where they
    run without blocking workers (:func:`complete`): constraints are NOT VALID until validated,
    and only the outputs of runs in flight are backfilled inside the transaction. The index and
    the validations are done before this returns; the history backfill (finished runs) is left
    pending for the caller to run with ``complete(conn, history=True)`` once the migrations
    after the baseline are applied (``pgflow migrate apply`` does).

    Args:
        conn: an autocommit connection (the caller holds the migrator lock).
        recognition: what :func:`~pgflow_cli.upstream.recognise.recognise` found; it is checked
            again inside the transaction and a change refuses the adoption.
        lock_timeout: seconds each lock may be waited for, per attempt.
        attempts: tries on lock timeouts and deadlocks.
        dry_run: run the transaction (everything in it, as on a small database), then roll back.
        progress: ``progress(event, data)``: ``start``, ``retry``, ``done``, ``batch``, ``phase``.
        before_commit: hook run inside the transaction just before it commits (or rolls back,
            in a dry run); ``--dry-run`` reporting uses it.
        assume_release: the release the operator asserted (``--assume-release``), for the recheck.
        online: ``auto`` (online above :data:`ONLINE_THRESHOLD_BYTES`), ``always`` or ``never``.
        batch_seconds: time each backfill batch of the online completion aims at, seconds.

    Returns:
        :class:`Adopted`.

    Raises:
        StateConflict: not adoptable (:func:`check_adoptable`), or the schema changed between
            the plan and the locked recheck (exit 6).
        LockTimeout: a lock could not be taken within the retries (exit 4).
    """
    if online not in ("auto", "always", "never"):
        raise ValueError(f"online must be auto, always or never, not {online!r}")
    check_adoptable(recognition)
    emit = progress or (lambda event, data: None)
    parts = adoption_parts(conn, recognition)
    checksum = adoption_checksum(parts)
    release = recognition.release
    assert release is not None
    use_online = not dry_run and (online == "always" or (online == "auto" and large(conn)))
    label = adoption_label(recognition)
    tries = 0
    notices: list[str] = []
    result: dict[str, Any] = {}

    def collect(diag: psycopg.errors.Diagnostic) -> None:
        if diag.message_primary:
            notices.append(diag.message_primary)

    def attempt() -> None:
        nonlocal tries
        tries += 1
        notices.clear()
        emit("start", {"migration": label, "release": release, "attempt": tries, "online": use_online})
        started = time.monotonic()
        try:
            with locked_transaction(conn, adoption_locks(conn), lock_timeout=lock_timeout):
                _recheck(conn, recognition, assume_release)
                had_output = bool(scalar(conn.execute(sqlfiles.statement(QUERIES, "has_output_column"))))
                before = set(_unvalidated(conn))
                for part in parts:
                    conn.execute(part.sql)  # shipped SQL (and quoted literals)
                if not had_output:
                    _backfill_batch(conn, 0, 2 ** 31, in_flight_only=use_online)  # every page
                added = [c for c in _unvalidated(conn) if c not in before]
                pending: list[dict[str, Any]] = []
                if use_online:
                    pending = [{"step": "index"}, *[{"step": "validate", "table": t, "constraint": c} for t, c in added],
                               *([] if had_output else [{"step": HISTORY_STEP, "next_page": 0}])]
                else:
                    for table, constraint in added:
                        conn.execute(_validate_statement(table, constraint))
                    conn.execute(sqlfiles.statement(QUERIES, "skipped_index"))
                _record(conn, recognition, checksum, pending, int((time.monotonic() - started) * 1000))
                result["ms"] = int((time.monotonic() - started) * 1000)
                if before_commit:
                    before_commit(conn)
                if dry_run:
                    raise _DryRun()
        except _DryRun:
            pass

    def on_retry(number: int, exc: BaseException, delay: float) -> None:
        emit("retry", {"migration": label, "attempt": number, "error": first_line(exc), "sleep": round(delay, 2)})

    conn.add_notice_handler(collect)
    try:
        retry_on_lock(attempt, attempts=attempts, on_retry=on_retry)
    finally:
        conn.remove_notice_handler(collect)
    emit("done", {"migration": label, "release": release, "duration_ms": result["ms"], "attempts": tries,
                  "dry_run": dry_run, "online": use_online})
    if use_online:
        complete(conn, lock_timeout=lock_timeout, attempts=attempts, progress=progress, batch_seconds=batch_seconds,
                 history=False)
    return Adopted(release, recognition.releases, recognition.assumed, [d.to_dict() for d in recognition.differences],
                   result["ms"], tries, dry_run, use_online, list(notices))


def pending_completion(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """What an online adoption still has to do after its commit (empty: nothing, or no adoption).

    Returns:
        The pending steps in order: ``{"step": "index"}``, ``{"step": "validate", "table",
        "constraint"}``, ``{"step": "backfill", "next_page": n}`` (the history backfill, resumed
        at heap page ``n`` of step_states).
    """
    if rec.read_facts(conn).context.get("adoption_record") != "present":
        return []
    row = conn.execute(sqlfiles.statement(QUERIES, "adoption_pending")).fetchone()
    return list(row[0]) if row else []


@dataclass(frozen=True)
class HistoryBackfill:
    """How far the history backfill (outputs of finished runs) of an online adoption is.

    Attributes:
        next_page: the step_states heap page it continues at.
        pages: heap pages of step_states now (it grows while the backfill runs).
    """

    next_page: int
    pages: int

    def describe(self) -> str:
        """``page 120 of 4000``."""
        return f"page {min(self.next_page, self.pages)} of {self.pages}"


def history_pending(conn: psycopg.Connection) -> HistoryBackfill | None:
    """The history backfill still to run, or ``None`` (done, or never needed). Reads the record
    and the relation size only (no scan)."""
    step = next((s for s in pending_completion(conn) if s["step"] == HISTORY_STEP), None)
    if step is None:
        return None
    pages = scalar(conn.execute(sqlfiles.statement(QUERIES, "step_states_pages")))
    return HistoryBackfill(int(step.get("next_page", 0)), int(pages or 0))


def complete(conn: psycopg.Connection, *, lock_timeout: float = 5.0, attempts: int = 5,
             progress: ProgressFn | None = None, batch_seconds: float = 0.2, history: bool = True) -> int:
    """Finish an online adoption after its commit; resumable (each step is recorded when done).

    Steps, in order, none of which blocks workers for longer than one short batch:

    * ``index``: ``CREATE INDEX CONCURRENTLY`` of the baseline's skipped-steps index;
    * ``validate``: ``VALIDATE CONSTRAINT`` of each constraint adoption added NOT VALID, each in
      its own transaction (SHARE UPDATE EXCLUSIVE: reads and writes go on);
    * ``backfill`` (only with ``history``): the step output backfill of finished runs, a range of
      step_states heap pages per transaction, sized so a batch takes about ``batch_seconds`` (its
      rows stay locked that long; they belong to finished runs, which no worker touches). Each
      batch records the page it reached in the same transaction, so a killed client loses at
      most one batch; a last pass over the whole table catches rows a table rewrite moved.
      Until it is done, ``get_run_with_states`` shows ``output`` null for the completed steps
      of finished runs (their tasks keep their outputs); nothing the runtime reads is missing.

    Args:
        history: also run the history backfill (``pgflow migrate apply --fill-history`` runs it
            after the migrations, so the upgrade is not kept waiting by it).

    Returns:
        How many steps were done (0 when nothing was pending).

    Raises:
        LockTimeout: a lock could not be taken within the retries (exit 4); rerun to resume.
        psycopg.errors.CheckViolation: an existing row breaks a baseline constraint (the
            constraint stays NOT VALID; rerun after fixing the row).
    """
    emit = progress or (lambda event, data: None)
    pending = pending_completion(conn)
    done = 0
    for step in [s for s in pending if history or s["step"] != HISTORY_STEP]:
        mode = "online, in batches; the migrations are committed" if step["step"] == HISTORY_STEP else "online"
        emit("phase", {"migration": COMPLETION_LABEL, "phase": step["step"], **step, "mode": mode})
        started = time.monotonic()
        if step["step"] == HISTORY_STEP:
            _online_backfill(conn, pending, step, lock_timeout, attempts, emit, batch_seconds)
        elif step["step"] == "index":
            _online_index(conn, lock_timeout)
        else:
            def validate(step: dict[str, Any] = step) -> None:
                with transaction(conn, lock_timeout=lock_timeout, statement_timeout=None):
                    conn.execute(_validate_statement(step["table"], step["constraint"]))
            retry_on_lock(validate, attempts=attempts)
        pending = [s for s in pending if s is not step]

        def record(left: list[dict[str, Any]] = pending) -> None:
            with transaction(conn, lock_timeout=lock_timeout, statement_timeout=None):
                _record_pending(conn, left)
        retry_on_lock(record, attempts=attempts)
        done += 1
        emit("phase_done", {"migration": COMPLETION_LABEL, "phase": step["step"],
                            "duration_ms": int((time.monotonic() - started) * 1000)})
    return done


def _record_pending(conn: psycopg.Connection, pending: list[dict[str, Any]]) -> None:
    conn.execute(sqlfiles.statement(QUERIES, "adoption_progress"), {"pending": Jsonb(pending)})


def _unvalidated(conn: psycopg.Connection) -> list[tuple[str, str]]:
    return [(t, c) for t, c in conn.execute(sqlfiles.statement(QUERIES, "unvalidated_constraints")).fetchall()]


def _validate_statement(table: str, constraint: str) -> pgsql.Composed:
    return pgsql.SQL(sqlfiles.statement(QUERIES, "validate_constraint")).format(
        table=pgsql.Identifier(table), constraint=pgsql.Identifier(constraint))


def _backfill_batch(conn: psycopg.Connection, first_page: int, pages: int, *, in_flight_only: bool) -> tuple[int, int]:
    row = conn.execute(sqlfiles.statement(QUERIES, "step_output_backfill"),
                       {"first_page": first_page, "pages": pages, "in_flight_only": in_flight_only}).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def _online_backfill(conn: psycopg.Connection, pending: list[dict[str, Any]], step: dict[str, Any],
                     lock_timeout: float, attempts: int, emit: ProgressFn, batch_seconds: float) -> None:
    """The history backfill in batches from the recorded page; ``step`` (an item of ``pending``)
    is updated with the page reached, recorded with each batch."""
    first_page, pages = int(step.get("next_page", 0)), 256
    budget = batch_seconds if batch_seconds > 0 else 0.2
    while True:
        def one(first_page: int = first_page, pages: int = pages) -> tuple[int, int]:
            with transaction(conn, lock_timeout=lock_timeout, statement_timeout=None):
                counts = _backfill_batch(conn, first_page, pages, in_flight_only=False)
                step["next_page"] = first_page + pages
                _record_pending(conn, pending)
                return counts

        started = time.monotonic()
        updated, relation_pages = retry_on_lock(one, attempts=attempts)
        elapsed = time.monotonic() - started
        emit("batch", {"migration": COMPLETION_LABEL, "phase": HISTORY_STEP, "first_page": first_page, "pages": pages,
                       "relation_pages": relation_pages, "rows": updated, "ms": int(elapsed * 1000)})
        first_page += pages
        if first_page >= relation_pages:
            break
        wanted = pages * budget / elapsed if elapsed > 0 else pages * 2
        pages = max(1, min(MAX_BATCH_PAGES, int(max(pages / 4, min(pages * 2, wanted)))))

    def sweep() -> tuple[int, int]:
        # Rows whose page was passed can only be missing if a rewrite (VACUUM FULL, CLUSTER) moved
        # them; one pass over every page finds them (a scan: rows with an output are skipped).
        with transaction(conn, lock_timeout=lock_timeout, statement_timeout=None):
            return _backfill_batch(conn, 0, 2 ** 31, in_flight_only=False)
    started = time.monotonic()
    updated, relation_pages = retry_on_lock(sweep, attempts=attempts)
    emit("batch", {"migration": COMPLETION_LABEL, "phase": HISTORY_STEP, "first_page": 0, "pages": relation_pages,
                   "relation_pages": relation_pages, "rows": updated,
                   "ms": int((time.monotonic() - started) * 1000)})


def _online_index(conn: psycopg.Connection, lock_timeout: float) -> None:
    # Outside any transaction (CONCURRENTLY); a session lock_timeout still applies.
    timeout = sqlfiles.statement(INSTALLER_QUERIES, "session_lock_timeout")
    conn.execute(timeout, {"value": f"{int(lock_timeout * 1000)}ms"})
    try:
        if scalar(conn.execute(sqlfiles.statement(QUERIES, "skipped_index_invalid"))):
            conn.execute(sqlfiles.statement(QUERIES, "skipped_index_drop"))
        conn.execute(sqlfiles.statement(QUERIES, "skipped_index_concurrently"))
    finally:
        conn.execute(timeout, {"value": "0"})


def _recheck(conn: psycopg.Connection, planned: rec.Recognition, assume_release: str | None) -> None:
    now = rec.recognise(conn, assume_release=assume_release)
    if (now.status, now.releases, now.differences) != (planned.status, planned.releases, planned.differences):
        raise StateConflict(
            "the pgflow schema changed since it was recognised; nothing was adopted",
            hint="run `pgflow migrate plan` again",
            detail=[f"planned: {planned.summary()}", f"now: {now.summary()}"],
        )


def _record(conn: psycopg.Connection, recognition: rec.Recognition, checksum: str, pending: list[dict[str, Any]],
            duration_ms: int) -> None:
    """The adoption record and the ledger rows of the baseline migrations (same transaction)."""
    conn.execute(sqlfiles.statement(QUERIES, "adoption_insert"), {
        "release": recognition.release,
        "releases": list(recognition.releases),
        "assumed": recognition.assumed,
        "differences": Jsonb([d.to_dict() for d in recognition.differences]),
        "cron_jobs": Jsonb([j.to_dict() for j in recognition.cron_jobs]),
        "supabase_history": Jsonb(recognition.supabase.to_dict()) if recognition.supabase else None,
        "checksum": checksum,
        "tool_version": __version__,
        "pending": Jsonb(pending),
        "complete": not pending,
    })
    conn.execute(sqlfiles.statement(INSTALLER_QUERIES, "ledger_bootstrap"))
    for migration in _baseline_migrations():
        conn.execute(sqlfiles.statement(INSTALLER_QUERIES, "ledger_record"), {
            "version": migration.version, "name": migration.name, "checksum": migration.checksum,
            "tool_version": __version__, "duration_ms": duration_ms, "state": "applied", "phases_done": [],
        })


def describe(parts: list[AdoptionPart]) -> str:
    """The adoption as one SQL script (``--sql``): the statements in order, inside BEGIN/COMMIT.

    The statements the driver adds around the parts (the step output backfill, the constraint
    validation, the index, the adoption record and ledger rows) are named in comments with the
    file and section they come from.
    """
    body = "\n\n".join(f"-- ==== {p.label}\n{p.sql.strip()}" for p in parts)
    tail = (
        "-- ==== then, in the same transaction (sql/queries/adopt.sql):\n"
        "--   step_output_backfill  when step_states.output was missing (releases before 0.13.0): every\n"
        "--                         completed step on a small database, the runs in flight on a large one\n"
        "--   validate_constraint   each constraint added NOT VALID above (small database)\n"
        "--   skipped_index         idx_step_states_skipped (small database)\n"
        "--   adoption_insert       the adoption record; then the ledger rows of 0001 and 0002\n"
        "-- On a large database the index (CONCURRENTLY) and the validations run after COMMIT, each\n"
        "-- in its own short transaction; the backfill of finished runs (history) runs in batches\n"
        "-- after the migrations that follow (`pgflow migrate status` reports it until it is done).\n"
    )
    return "BEGIN;\n\n" + body + "\n\n" + tail + "COMMIT;\n"

"""``pgflow runs``: list and show runs (read-only), start and await them (through the run client).

``list`` and ``show`` only read (SELECT on the pgflow tables, ``sql/queries/runs.sql``), on every schema
level from the protocol-1 baseline on. ``start`` and ``wait`` go through :mod:`pgflow_cli.client`. Run
inputs and PGMQ message bodies are never read back; step and task outputs only when asked for
(``--show-output``). Every command that takes a run id takes a unique prefix of one
(:func:`resolve_run_id`, the one resolver). docs/commands/runs.md.
"""

from __future__ import annotations

import datetime as dt
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgflow_cli import client, db, sqlfiles
from pgflow_cli.db import scalar, transaction
from pgflow_cli.errors import StateConflict, UsageError
from pgflow_cli.operations import names, schema
from pgflow_cli.operations.status import RUN_STATES, utc_iso

MAX_CANCEL_REASON = client.MAX_CANCEL_REASON
"""Characters of a cancel reason the database keeps (the client's limit, for the command's check)."""

QUERIES = "queries/runs.sql"

LIST_KIND = "pgflow-cli/runs-list"
SHOW_KIND = "pgflow-cli/runs-show"
START_KIND = "pgflow-cli/runs-start"
WAIT_KIND = "pgflow-cli/runs-wait"
RETRY_KIND = "pgflow-cli/runs-retry"
RESUME_KIND = "pgflow-cli/runs-resume"
CANCEL_KIND = "pgflow-cli/runs-cancel"
DOCUMENT_VERSION = 1

MAX_LIMIT = 1000
"""Largest page of ``runs list``."""


def parse_run_id(text: str, what: str = "RUN_ID") -> str:
    """The canonical text of a run id, or :class:`UsageError` (exit 2) naming what was wrong."""
    try:
        return str(uuid.UUID(text.strip()))
    except ValueError:
        raise UsageError(f"{what} {text!r} is not a run id (a UUID such as 6f1c2a9e-8d3b-4c5e-9f10-2a3b4c5d6e7f)",
                         hint="`pgflow runs list` shows the run ids") from None


MIN_PREFIX = 4
"""Fewest hex digits of a run id prefix (as git's shortest abbreviation)."""
MAX_MATCHES = 10
"""Matches an ambiguous prefix's error lists."""

_DASHES = (8, 13, 18, 23)
_HEX = re.compile(r"[0-9a-f]+")


def parse_run_ref(text: str, what: str = "RUN_ID") -> str:
    """A run id, or a prefix of one, as lower-case hex digits (a full id as its canonical text);
    checked before any connection.

    A prefix has at least :data:`MIN_PREFIX` hex digits, written without dashes or with them where
    a run id has them (``6f1c2a9e-8d3b``).

    Raises:
        UsageError: neither a run id nor a prefix of one (exit 2).
    """
    raw = text.strip().lower()
    with_dashes = all(raw[i] == "-" for i in _DASHES if i < len(raw))
    digits = raw.replace("-", "") if "-" in raw and with_dashes else raw
    if len(digits) == 32 and _HEX.fullmatch(digits):
        return str(uuid.UUID(digits))
    if not (MIN_PREFIX <= len(digits) < 32 and _HEX.fullmatch(digits)):
        raise UsageError(f"{what} {text!r} is neither a run id nor a prefix of one (at least {MIN_PREFIX} of its "
                         "hex digits, e.g. 6f1c2a9e)", hint="`pgflow runs list` shows the run ids")
    return digits


def resolve_run_id(conn: psycopg.Connection, text: str, what: str = "RUN_ID") -> str:
    """The run id ``text`` names: a whole run id as it is (whether or not such a run exists; the
    command says so), or the one run whose id starts with the prefix ``text`` (git-style).

    Every command that takes a run id resolves it here, so a prefix works the same everywhere.

    Args:
        conn: a connection (a read of ``pgflow.runs`` by primary key range).
        text: a run id or a prefix of one (:func:`parse_run_ref`).
        what: how messages name the argument (``RUN_ID``, ``--before``).

    Raises:
        UsageError: not a run id or prefix, or a prefix several runs share (exit 2; the matches,
            up to :data:`MAX_MATCHES`, are listed).
        StateConflict: no run id starts with the prefix (exit 6).
    """
    ref = parse_run_ref(text, what)
    if len(ref) == 36:
        return ref
    bounds = {"low": str(uuid.UUID(ref.ljust(32, "0"))), "high": str(uuid.UUID(ref.ljust(32, "f"))),
              "limit": MAX_MATCHES + 1}
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(sqlfiles.statement(QUERIES, "runs_with_prefix"), bounds).fetchall()
    if not rows:
        raise StateConflict(f"no run id starts with {text.strip()!r}", hint="`pgflow runs list` shows the run ids")
    if len(rows) > 1:
        shown = rows[:MAX_MATCHES]
        more = ["..."] if len(rows) > MAX_MATCHES else []
        raise UsageError(f"{what} {text.strip()!r} is ambiguous: {len(shown)}{'+' if more else ''} runs start with it",
                         hint="give more of the id",
                         detail=[f"{row['run_id']}  {row['flow_slug']}  {row['status']}  started {utc_iso(row['started_at'])}"
                                 for row in shown] + more)
    return str(rows[0]["run_id"])


def _timestamps(row: dict[str, Any]) -> dict[str, Any]:
    return {k: utc_iso(v) if isinstance(v, dt.datetime) else v for k, v in row.items()}


@dataclass(frozen=True)
class RunSummary:
    """One row of ``runs list``: a run, its state and times, how many of its steps failed.

    Timestamps are timezone-aware; ``completed_at``/``failed_at`` are None until the run ends.
    """

    run_id: str
    flow_slug: str
    status: str
    started_at: dt.datetime
    completed_at: dt.datetime | None
    failed_at: dt.datetime | None
    remaining_steps: int
    steps: int
    failed_steps: int

    def to_dict(self) -> dict[str, Any]:
        return _timestamps(dict(self.__dict__))


@dataclass
class RunPage:
    """A page of ``runs list``, newest first; ``next_before`` is the ``--before`` of the next page (None: last page)."""

    runs: list[RunSummary]
    flow: str | None
    status: str | None
    limit: int
    before: str | None
    next_before: str | None

    def to_document(self) -> dict[str, Any]:
        """The versioned JSON document (docs/schemas/runs-list.schema.json)."""
        return {
            "kind": LIST_KIND, "version": DOCUMENT_VERSION,
            "filter": {"flow": self.flow, "status": self.status, "before": self.before, "limit": self.limit},
            "runs": [r.to_dict() for r in self.runs],
            "next_before": self.next_before,
        }


def list_runs(
    conn: psycopg.Connection,
    *,
    flow: str | None = None,
    status: str | None = None,
    limit: int = 20,
    before: str | None = None,
) -> RunPage:
    """Runs newest first (by ``started_at``, then id), at most ``limit``, in one read-only transaction.

    Args:
        conn: an autocommit connection.
        flow: exact flow slug, or None for every flow.
        status: one of :data:`RUN_STATES`, or None.
        limit: page size, 1..:data:`MAX_LIMIT`.
        before: a run id: only runs that sort after it (started earlier); the previous page's ``next_before``.

    Raises:
        UsageError: a bad status, limit or ``before`` (exit 2).
        StateConflict: ``flow`` or ``before`` names nothing (exit 6).
    """
    if status is not None and status not in RUN_STATES:
        raise UsageError(f"unknown run status {status!r}", hint="choose from: " + ", ".join(RUN_STATES))
    if not 1 <= limit <= MAX_LIMIT:
        raise UsageError(f"--limit must be between 1 and {MAX_LIMIT}, got {limit}")
    if before is not None:
        parse_run_ref(before, "--before")
    with transaction(conn, read_only=True, isolation="repeatable read"):
        before_id = resolve_run_id(conn, before, "--before") if before is not None else None
        params = {"flow": flow, "status": status, "limit": limit, "before": before_id}
        if flow is not None and not scalar(conn.execute(sqlfiles.statement(QUERIES, "flow_exists"), params)):
            raise StateConflict(f"no flow named {names.unknown_flows(conn, [flow])}",
                                hint="flow slugs are exact and case-sensitive")
        if before_id is not None and not scalar(conn.execute(sqlfiles.statement(QUERIES, "run_exists"),
                                                             {"run_id": before_id})):
            raise StateConflict(f"no run {before_id} (the --before run)", hint="pass a run id that `runs list` showed")
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(sqlfiles.statement(QUERIES, "list"), params).fetchall()
    runs = [RunSummary(**{**row, "run_id": str(row["run_id"])}) for row in rows[:limit]]
    next_before = runs[-1].run_id if len(rows) > limit else None
    return RunPage(runs, flow, status, limit, before_id, next_before)


@dataclass
class RunDetail:
    """``runs show``: one run, its steps and its tasks (attempts, errors; outputs only when asked).

    Attributes:
        run: the run's columns (no input; ``output`` only with outputs shown), with its lineage
            (``restart_of_run_id``, ``restart_kind``) and a cancel's record (``cancelled_at``,
            ``cancel_reason``, ``cancelled_by``; None before migration 0003).
        steps: per step in definition order: state, task counts, error, times, max attempts, timeout.
        tasks: per task: state, attempts used, requeues, last error, message id (never the body), times.
        tasks_total: how many tasks the run has (``tasks`` holds at most ``max_tasks`` of them).
        show_output: whether outputs were read.
        restarted_as: the runs that retry or resume this one (``run_id``, ``restart_kind``,
            ``status``, ``started_at``), oldest first, at most 20.
    """

    run: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    tasks: list[dict[str, Any]] = field(default_factory=list)
    tasks_total: int = 0
    show_output: bool = False
    restarted_as: list[dict[str, Any]] = field(default_factory=list)

    def to_document(self) -> dict[str, Any]:
        """The versioned JSON document (docs/schemas/runs-show.schema.json)."""
        return {
            "kind": SHOW_KIND, "version": DOCUMENT_VERSION,
            "show_output": self.show_output,
            "run": _timestamps(self.run),
            "steps": [_timestamps(s) for s in self.steps],
            "tasks": [_timestamps(t) for t in self.tasks],
            "tasks_total": self.tasks_total,
            "tasks_shown": len(self.tasks),
            "restarted_as": [_timestamps(r) for r in self.restarted_as],
        }


def show_run(conn: psycopg.Connection, run_id: str, *, show_output: bool = False, max_tasks: int = 200) -> RunDetail:
    """Read one run with its steps and tasks in one read-only snapshot.

    Args:
        conn: an autocommit connection.
        run_id: the run's id or a unique prefix of it (:func:`resolve_run_id`).
        show_output: also read the run's, steps' and tasks' outputs.
        max_tasks: at most this many tasks (by step order, then index).

    Raises:
        UsageError: ``run_id`` is neither a run id nor a unique prefix, or ``max_tasks`` < 1 (exit 2).
        StateConflict: no such run (exit 6).
    """
    parse_run_ref(run_id)
    if max_tasks < 1:
        raise UsageError(f"--max-tasks must be at least 1, got {max_tasks}")
    with transaction(conn, read_only=True, isolation="repeatable read"), conn.cursor(row_factory=dict_row) as cur:
        canonical = resolve_run_id(conn, run_id)
        params = {"run_id": canonical, "show_output": show_output, "max_tasks": max_tasks}
        run = cur.execute(sqlfiles.statement(QUERIES, "run"), params).fetchone()
        if run is None:
            raise StateConflict(f"no run {canonical}", hint="`pgflow runs list` shows the run ids")
        restarts = bool(scalar(conn.execute(sqlfiles.statement(QUERIES, "has_restarts"))))
        run.update(_run_record(cur, canonical, restarts))
        steps = cur.execute(sqlfiles.statement(QUERIES, "steps"), params).fetchall()
        tasks = cur.execute(sqlfiles.statement(QUERIES, "tasks"), params).fetchall()
        restarted_as = cur.execute(sqlfiles.statement(QUERIES, "restarted_as"), params).fetchall() if restarts else []
    total = tasks[0]["total"] if tasks else 0
    for task in tasks:
        del task["total"]
        for key in ("last_worker_id",):
            task[key] = str(task[key]) if task[key] is not None else None
    if not show_output:
        for item in (run, *steps, *tasks):
            item.pop("output", None)
    return RunDetail(_ids(run), steps, tasks, total, show_output, [_ids(r) for r in restarted_as])


RUN_RECORD = ("restart_of_run_id", "restart_kind", "cancelled_at", "cancel_reason", "cancelled_by")
"""A run's lineage and cancel record, kept beside ``pgflow.runs`` (whose row type is upstream's)."""


def _run_record(cur: psycopg.Cursor[dict[str, Any]], run_id: str, restarts: bool) -> dict[str, Any]:
    """The :data:`RUN_RECORD` fields of a run: its ``pgflow.run_restarts`` and
    ``pgflow.run_cancellations`` rows, each field None where there is none (and before migration
    0003, ``restarts`` false, where those tables do not exist)."""
    row = cur.execute(sqlfiles.statement(QUERIES, "run_record"), {"run_id": run_id}).fetchone() if restarts else None
    return {key: (row or {}).get(key) for key in RUN_RECORD}


def _ids(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with its run ids as text."""
    return {k: str(v) if k in ("run_id", "restart_of_run_id") and v is not None else v for k, v in row.items()}


# ------------------------------------------------------------------------------------------------
# runs start / runs wait
# ------------------------------------------------------------------------------------------------
PROGRESS_EVERY = 5.0
"""Seconds between progress lines while a command waits (on stderr)."""

WAIT_POLICY = client.PollPolicy(first_interval=0.05, factor=1.5, max_interval=1.0, reconnect_timeout=30.0)
"""How the command line looks at the run it awaits: the client's default backoff with at most 1 s
between looks (one person, one run: a quicker answer is worth one statement a second)."""


@dataclass
class RunReport:
    """What ``runs start`` and ``runs wait`` report: the run as last read and, when awaited, how the
    wait ended.

    Attributes:
        kind: :data:`START_KIND` or :data:`WAIT_KIND`.
        run: ``run_id``, ``flow_slug``, ``status``, ``remaining_steps``, ``started_at``, ``ended_at``.
        waited: whether the command awaited the run (``runs start`` without ``--wait``: no).
        outcome: ``completed``, ``failed``, ``deadline`` (the timeout came first), or None (not awaited).
        timeout_seconds: the ``--timeout`` given (None: none).
        waited_seconds: how long the command waited.
        output: a completed run's output, only when ``show_output``.
        failures: a failed run's failed steps, each with its error and failed tasks.
        show_output: whether the output was asked for.
    """

    kind: str
    run: dict[str, Any]
    waited: bool = False
    outcome: str | None = None
    timeout_seconds: float | None = None
    waited_seconds: float | None = None
    output: Any = None
    failures: list[dict[str, Any]] = field(default_factory=list)
    show_output: bool = False

    def to_document(self) -> dict[str, Any]:
        """The versioned JSON document (docs/schemas/runs-start.schema.json, runs-wait.schema.json)."""
        wait = None
        if self.waited:
            wait = {"outcome": self.outcome, "timeout_seconds": self.timeout_seconds,
                    "waited_seconds": round(self.waited_seconds or 0.0, 3), "failures": self.failures}
            if self.show_output:
                wait["output"] = self.output
        return {"kind": self.kind, "version": DOCUMENT_VERSION, "show_output": self.show_output,
                "run": _timestamps(self.run), "wait": wait}


def read_run(conn: psycopg.Connection, run_id: str) -> dict[str, Any]:
    """A run's row as :class:`RunReport` keeps it (no input, no output).

    Args:
        conn: an autocommit connection.
        run_id: a run id or a unique prefix of one (:func:`resolve_run_id`).

    Raises:
        UsageError: not a run id, or an ambiguous prefix (exit 2).
        StateConflict: no such run (exit 6).
    """
    with conn.cursor(row_factory=dict_row) as cur:
        canonical = resolve_run_id(conn, run_id)
        row = cur.execute(sqlfiles.statement(QUERIES, "run"), {"run_id": canonical, "show_output": False}).fetchone()
    if row is None:
        raise StateConflict(f"no run {canonical}", hint="`pgflow runs list` shows the run ids")
    return {"run_id": str(row["run_id"]), "flow_slug": row["flow_slug"], "status": row["status"],
            "remaining_steps": row["remaining_steps"], "started_at": row["started_at"],
            "ended_at": row["completed_at"] or row["failed_at"]}


def read_input(value: str, stdin: Callable[[], str]) -> client.RawJson:
    """The run input of ``--input``: JSON text, ``@FILE`` (a file's text) or ``@-`` (standard input),
    checked as PostgreSQL will read it (:mod:`pgflow_cli.jsoncheck`) before anything is sent.

    Raises:
        UsageError, JsonValueError: unreadable file, not JSON, or a value jsonb refuses, with its path (exit 2).
    """
    from pgflow_cli import jsoncheck

    what = "--input"
    text = value
    if value.startswith("@"):
        name = value[1:]
        what = "standard input" if name == "-" else name
        try:
            text = stdin() if name == "-" else open(name, encoding="utf-8").read()  # noqa: SIM115
        except OSError as exc:
            raise UsageError(f"--input {value}: cannot read {name}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise UsageError(f"--input {value}: {name} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    jsoncheck.parse_text(text, what=what)
    return client.RawJson(text)


def start_run(conn: psycopg.Connection, flow_slug: str, run_input: client.RawJson) -> RunReport:
    """Start one run (``pgflow.start_flow``, one statement on an autocommit connection).

    Raises:
        FlowNotFound: no such flow (exit 6); InvalidInput: the flow cannot take the input (exit 2).
    """
    run = client.start_run(conn, flow_slug, run_input)
    return RunReport(START_KIND, {"run_id": run.run_id, "flow_slug": run.flow_slug, "status": run.status,
                                  "remaining_steps": run.remaining_steps, "started_at": run.started_at,
                                  "ended_at": None})


def await_run(target: db.Target, report: RunReport, *, timeout: float | None, show_output: bool,
              on_progress: Callable[[client.RunProgress, float], None], connect_timeout: int = 10) -> RunReport:
    """Await the run of ``report`` (a client of its own) and fill in how the wait ended.

    Args:
        target: the database.
        report: from :func:`start_run` or a :data:`WAIT_KIND` report of :func:`read_run`.
        timeout: seconds to wait at most (None: until it ends).
        show_output: keep a completed run's output in the report.
        on_progress: called every :data:`PROGRESS_EVERY` seconds with where the run stood and the
            seconds waited so far.
        connect_timeout: seconds libpq waits for the server.

    Returns:
        ``report`` with ``outcome`` ``completed``, ``failed`` or ``deadline``.

    Raises:
        RunNotFound (exit 6), ConnectionFailed (exit 3: lost and not restored within 30 s).
    """
    began = time.monotonic()
    report.waited, report.timeout_seconds, report.show_output = True, timeout, show_output
    run_id = report.run["run_id"]
    with client.Client(target, connect_timeout=connect_timeout, poll=WAIT_POLICY,
                       application_name="pgflow-cli runs wait") as waiter:
        try:
            outcome = waiter.outcome(run_id, timeout=timeout, progress_every=PROGRESS_EVERY,
                                     on_progress=lambda progress: on_progress(progress, time.monotonic() - began))
        except client.WaitTimeout as late:
            report.outcome = "deadline"
            if late.progress is not None and late.progress.status is not None:
                report.run.update(status=late.progress.status, remaining_steps=late.progress.remaining_steps)
            report.waited_seconds = time.monotonic() - began
            return report
    report.waited_seconds = time.monotonic() - began
    report.outcome = outcome.status
    report.run.update(status=outcome.status, ended_at=outcome.ended_at, remaining_steps=outcome.remaining_steps)
    report.output = outcome.output if show_output else None
    report.failures = [{"step_slug": f.step_slug, "error_message": f.error_message,
                        "tasks": [{"task_index": t.task_index, "error_message": t.error_message,
                                   "attempts_count": t.attempts_count} for t in f.tasks]}
                       for f in outcome.failures]
    return report


# ------------------------------------------------------------------------------------------------
# runs retry / runs resume / runs cancel
# ------------------------------------------------------------------------------------------------
def require_run_operations(conn: psycopg.Connection) -> None:
    """Raise :class:`SchemaMissing` (exit 3, ``schema_missing`` / ``schema_behind``) when the database
    cannot cancel or restart runs (no ``pgflow.cancel_run``: before migration 0003)."""
    if not scalar(conn.execute(sqlfiles.statement(QUERIES, "has_run_operations"))):
        raise schema.missing_feature(conn, "cancelling and restarting runs (pgflow.cancel_run, retry_run, resume_run)")


@dataclass
class RestartReport:
    """What ``runs retry`` and ``runs resume`` report.

    Attributes:
        kind: :data:`RETRY_KIND` or :data:`RESUME_KIND`.
        source: the restarted run (``run_id``, ``flow_slug``, ``status``) as it is, unchanged.
        run: the new run (``run_id``, ``flow_slug``, ``status``, ``remaining_steps``, ``started_at``,
            ``restart_of_run_id``).
        reused_tasks: tasks the new run took over completed from the source (0 for a retry).
        queued_tasks: tasks the new run queued (or, manual, waits for) when it started.
    """

    kind: str
    source: dict[str, Any]
    run: dict[str, Any]
    reused_tasks: int
    queued_tasks: int

    def to_document(self) -> dict[str, Any]:
        """The versioned JSON document (docs/schemas/runs-restart.schema.json)."""
        return {"kind": self.kind, "version": DOCUMENT_VERSION, "source": _timestamps(self.source),
                "run": _timestamps(self.run), "reused_tasks": self.reused_tasks, "queued_tasks": self.queued_tasks}


def restart_run(conn: psycopg.Connection, run_ref: str, *, resume: bool) -> RestartReport:
    """Retry or resume a failed run in one transaction (``pgflow.retry_run`` / ``pgflow.resume_run``
    through :mod:`pgflow_cli.client`), and count how the new run began.

    Args:
        conn: an autocommit connection of an operator role (docs/permissions.md "Run operators").
        run_ref: the failed run's id or a unique prefix of it (:func:`resolve_run_id`).
        resume: resume (reuse every completed task) instead of retry (a fresh run).

    Raises:
        UsageError: not a run id or an ambiguous prefix (exit 2); InvalidInput: the flow cannot take
            the input any more (exit 2).
        StateConflict: no such run, or RunStateConflict: it is not failed, or (resume) its flow was
            compiled again since (exit 6).
        SchemaMissing: no restarts before migration 0003 (exit 3).
    """
    require_run_operations(conn)
    with transaction(conn), conn.cursor(row_factory=dict_row) as cur:
        canonical = resolve_run_id(conn, run_ref)
        run = client.resume_run(conn, canonical) if resume else client.retry_run(conn, canonical)
        source = read_run(conn, canonical)
        counts = cur.execute(sqlfiles.statement(QUERIES, "restart_tasks"), {"run_id": run.run_id}).fetchone()
    assert counts is not None
    return RestartReport(RESUME_KIND if resume else RETRY_KIND,
                         {"run_id": source["run_id"], "flow_slug": source["flow_slug"], "status": source["status"]},
                         {"run_id": run.run_id, "flow_slug": run.flow_slug, "status": run.status,
                          "remaining_steps": run.remaining_steps, "started_at": run.started_at,
                          "restart_of_run_id": run.restart_of_run_id},
                         counts["reused"], counts["queued"])


@dataclass
class CancelPreview:
    """What ``runs cancel`` asks about: the run and the work a cancel would end."""

    run: dict[str, Any]
    queued: int
    running: int
    manual: int


def cancel_preview(conn: psycopg.Connection, run_ref: str) -> CancelPreview:
    """The run ``run_ref`` names and its unfinished tasks, read in one snapshot (nothing changes).

    Raises:
        SchemaMissing: the schema cannot cancel runs (before migration 0003; exit 3).
        UsageError (exit 2), StateConflict: no such run (exit 6).
    """
    require_run_operations(conn)
    with transaction(conn, read_only=True, isolation="repeatable read"), conn.cursor(row_factory=dict_row) as cur:
        run = read_run(conn, run_ref)
        counts = cur.execute(sqlfiles.statement(QUERIES, "in_flight"), {"run_id": run["run_id"]}).fetchone()
    assert counts is not None
    return CancelPreview(run, counts["queued"], counts["running"], counts["manual"])


@dataclass
class CancelReport:
    """What ``runs cancel`` reports.

    Attributes:
        run: ``run_id``, ``flow_slug``, ``status`` (``failed``), ``cancelled_at``, ``cancel_reason``,
            ``cancelled_by``.
        already: the run was cancelled before this call (nothing changed).
        tasks_cancelled: the run's tasks that are cancelled now (queued, started and manual ones).
    """

    run: dict[str, Any]
    already: bool
    tasks_cancelled: int

    def to_document(self) -> dict[str, Any]:
        """The versioned JSON document (docs/schemas/runs-cancel.schema.json)."""
        return {"kind": CANCEL_KIND, "version": DOCUMENT_VERSION, "run": _timestamps(self.run),
                "already_cancelled": self.already, "tasks_cancelled": self.tasks_cancelled}


def cancel_run(conn: psycopg.Connection, run_id: str, reason: str | None) -> CancelReport:
    """Cancel a started run (``pgflow.cancel_run`` through :mod:`pgflow_cli.client`), in one transaction.

    Args:
        conn: an autocommit connection of an operator role (docs/permissions.md "Run operators").
        run_id: the run's id (resolved already: :func:`cancel_preview`).
        reason: why (None: "cancelled by <role>"), at most 1000 characters.

    Raises:
        StateConflict: no such run, or RunStateConflict: it already completed or failed (exit 6).
        UsageError: a reason too long (exit 2); SchemaMissing: before migration 0003 (exit 3).
    """
    require_run_operations(conn)
    with transaction(conn), conn.cursor(row_factory=dict_row) as cur:
        record = sqlfiles.statement(QUERIES, "cancel_record")
        before = cur.execute(record, {"run_id": run_id}).fetchone()
        client.cancel_run(conn, run_id, reason)
        row = cur.execute(sqlfiles.statement(QUERIES, "run"), {"run_id": run_id, "show_output": False}).fetchone()
        after = cur.execute(record, {"run_id": run_id}).fetchone()
        assert row is not None and after is not None
        row.update(_run_record(cur, run_id, True))
    return CancelReport({"run_id": str(row["run_id"]), "flow_slug": row["flow_slug"], "status": row["status"],
                         "cancelled_at": row["cancelled_at"], "cancel_reason": row["cancel_reason"],
                         "cancelled_by": row["cancelled_by"]},
                        already=bool(before and before["cancelled"]), tasks_cancelled=after["tasks_cancelled"])

"""``pgflow drop-flow``: whole-flow deletion with a plan, a refusal rule, an export and a check
afterwards (docs/drop-flow.md; spec "Generated private ownership", whole-flow deletion).

SQL decides; this module only calls it and shapes the answers:

* :func:`plan` runs ``pgflow.drop_flow_plan(slug)`` (read-only, no locks) and returns a
  :class:`DropPlan`: rows per table, queues with their message counts and sizes, the flow's
  workers and fences, the queue problems and the verdict;
* :func:`refusal` turns a plan into the error the command must stop with, if any;
* :func:`drop` runs, in one transaction: the deletion's locks, the optional export of the
  definition and run history, then ``pgflow.drop_flow(slug, force)``, which rechecks everything
  under its locks. After the commit it checks from a fresh statement that nothing of the flow is
  left (:class:`DropResult.leftovers`).

Nothing here prints; message bodies, run inputs and outputs never leave the database except into
the export files the operator asked for.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import psycopg
from psycopg.rows import dict_row

from pgflow_cli import sqlfiles
from pgflow_cli.db import first_line, retry_on_lock, scalar, transaction
from pgflow_cli.errors import PgflowError, Refused, StateConflict, UsageError
from pgflow_cli.operations import names, schema

QUERIES = "queries/drop_flow.sql"

EXPORT_KIND = "pgflow-cli/drop-flow-export"
EXPORT_VERSION = 1
EXPORT_FILES = ("definition.json", "runs.jsonl", "step_states.jsonl", "step_tasks.jsonl", "manifest.json")
"""Files :func:`drop` writes into ``--export DIR`` (docs/drop-flow.md "Export")."""

TABLES = ("step_tasks", "step_states", "runs", "deps", "steps", "flows", "workers")
"""The tables deletion counts, in the order it deletes them."""


@dataclass(frozen=True)
class QueuePlan:
    """One queue of the flow's route (``pgflow._drop_flow_route``).

    Attributes:
        queue_name: canonical lowercase name.
        origins: ``default``, ``step:<slug>``, ``tasks``.
        listed_as: the exact ``pgmq.meta`` spelling, or ``None`` when no meta row lists it.
        state: ``present`` or ``missing`` (its queue table does not exist).
        messages: messages in the queue table (exact), ``None`` when missing.
        archived: rows in the archive table (exact), ``None`` when it does not exist.
        bytes: size of both tables with indexes.
        table_owner: the role owning the tables (dropping them is its right).
        problems: why the queue must not be dropped (empty: this flow's alone).
    """

    queue_name: str
    origins: list[str]
    listed_as: str | None
    state: str
    messages: int | None
    archived: int | None
    bytes: int
    table_owner: str | None
    problems: list[str]

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> QueuePlan:
        return cls(doc["queue_name"], list(doc["origins"]), doc["listed_as"], doc["state"], doc["messages"],
                   doc["archived"], int(doc["bytes"]), doc["table_owner"], list(doc["problems"]))


@dataclass(frozen=True)
class DropPlan:
    """What deleting one flow would do (``pgflow.drop_flow_plan``).

    Attributes:
        flow_slug: the exact slug.
        queue_mode: ``flow`` (plain) or ``step`` (private per-step queues).
        rows: rows that go, per table (``workers``: only stale and stopped rows).
        by_status: ``{"runs" | "step_states" | "step_tasks": {status: count}}``.
        queues: the route's queues.
        activity: the SQL activity document (workers, functions, fence, drain, blockers).
        problems: queue problems; deletion refuses while any exists, even with force.
        verdict: ``ready``, ``needs_force`` or ``refused``.
    """

    flow_slug: str
    queue_mode: str
    rows: dict[str, int]
    by_status: dict[str, dict[str, int]]
    queues: list[QueuePlan]
    activity: dict[str, Any]
    problems: list[str]
    verdict: str

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> DropPlan:
        return cls(doc["flow_slug"], doc["queue_mode"], {k: int(v) for k, v in doc["rows"].items()},
                   doc["by_status"], [QueuePlan.from_json(q) for q in doc["queues"]], doc["activity"],
                   list(doc["problems"]), doc["verdict"])

    @property
    def workers(self) -> list[dict[str, Any]]:
        """The flow's worker rows: ``worker_id``, ``function_name``, ``state`` (live, draining, stale, stopped), ..."""
        return list(self.activity["workers"])

    @property
    def blockers(self) -> list[str]:
        """Why deletion needs ``--force`` (empty when it does not)."""
        return list(self.activity["blockers"])

    def to_dict(self) -> dict[str, Any]:
        return {
            "flow_slug": self.flow_slug, "queue_mode": self.queue_mode, "verdict": self.verdict,
            "rows": self.rows, "by_status": self.by_status,
            "queues": [q.__dict__ for q in self.queues], "activity": self.activity, "problems": self.problems,
        }


@dataclass
class DropResult:
    """What the deletion did (``pgflow.drop_flow``) and what the check afterwards found.

    Attributes:
        deleted: rows deleted per table (:data:`TABLES`).
        queues: per queue: ``queue_name``, ``listed_as``, ``outcome`` (``dropped`` or
            ``already_gone``), ``messages`` and ``archived`` (rows that went with the tables),
            ``leftovers`` (what was cleaned up besides).
        workers_told_to_stop: live or draining worker rows now deprecated.
        activity: the activity seen under the locks.
        forced: ``--force`` was given.
        export: the files written (``None`` without ``--export``).
        leftovers: what the check after the commit still found (always empty unless a bug).
        seconds: wall time of the deletion transaction.
    """

    deleted: dict[str, int]
    queues: list[dict[str, Any]]
    workers_told_to_stop: int
    activity: dict[str, Any]
    forced: bool
    export: dict[str, Any] | None = None
    leftovers: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "deleted": self.deleted, "queues": self.queues, "workers_told_to_stop": self.workers_told_to_stop,
            "forced": self.forced, "export": self.export, "verified": not self.leftovers,
            "leftovers": self.leftovers, "seconds": round(self.seconds, 3),
        }


def require_installed(conn: psycopg.Connection) -> None:
    """Raise :class:`SchemaMissing` (exit 3) when the database lacks ``pgflow.drop_flow``."""
    schema.require_objects(conn, QUERIES, "whole-flow deletion (pgflow.drop_flow)")


def plan(conn: psycopg.Connection, flow_slug: str) -> DropPlan:
    """Read the plan of deleting ``flow_slug`` (exact slug) in one read-only statement.

    Raises:
        SchemaMissing: no ``pgflow.drop_flow`` here (exit 3).
        psycopg.Error: PF006 for an unknown flow (the CLI maps it to exit 6).
    """
    require_installed(conn)
    try:
        with transaction(conn, read_only=True, lock_timeout=None, statement_timeout=None):
            doc = scalar(conn.execute(sqlfiles.statement(QUERIES, "plan"), {"flow_slug": flow_slug}))
    except psycopg.Error as exc:
        if getattr(exc, "sqlstate", None) != "PF006":
            raise
        # the server's message already names a flow that differs only in letter case
        close = [n for n in names.suggestions(flow_slug, names.flow_slugs(conn)) if n.lower() != flow_slug.lower()]
        diag = exc.diag
        raise StateConflict((diag.message_primary or first_line(exc)).strip()
                            + (f" (did you mean {' or '.join(repr(n) for n in close)}?)" if close else ""),
                            hint=diag.message_hint or "slugs are exact and case-sensitive; `pgflow status` lists "
                            "every flow", detail=(diag.message_detail or "").splitlines()) from None
    return DropPlan.from_json(doc)


def refusal(the_plan: DropPlan, *, force: bool) -> PgflowError | None:
    """The error the command must stop with for this plan, or ``None`` to go ahead.

    * queue problems (``refused``): :class:`StateConflict` (exit 6), whatever ``force`` says;
    * activity (``needs_force``) without ``force``: :class:`Refused` (exit 1) naming the blockers.
    """
    if the_plan.verdict == "refused":
        return StateConflict(
            f"flow {the_plan.flow_slug!r} cannot be dropped: {len(the_plan.problems)} problem(s) with the queues "
            "it would drop; nothing was deleted",
            hint="pgflow drops only queues a flow owns alone; see docs/drop-flow.md \"Refusals\" for each problem",
            detail=the_plan.problems,
        )
    if the_plan.verdict == "needs_force" and not force:
        return Refused(
            f"flow {the_plan.flow_slug!r} is still active; nothing was deleted",
            hint="fence its worker functions and wait until no task is in flight (docs/drop-flow.md \"Before you "
            "drop\"), or pass --force to abandon its started runs",
            detail=the_plan.blockers,
        )
    return None


def prepare_export_dir(path: Path) -> Path:
    """Create ``path`` (mode 0700) or accept it when empty; refuse a non-empty one.

    Raises:
        UsageError: the path is a file, is not empty, or cannot be created (exit 2).
    """
    try:
        if path.exists():
            if not path.is_dir():
                raise UsageError(f"--export {path}: not a directory")
            if any(path.iterdir()):
                raise UsageError(f"--export {path}: the directory is not empty",
                                 hint="name a new or empty directory; an export never overwrites files")
        else:
            path.mkdir(mode=0o700, parents=True)
    except OSError as exc:
        raise UsageError(f"--export {path}: {exc.strerror or exc}") from None
    return path


def _write_lines(conn: psycopg.Connection, name: str, flow_slug: str, path: Path) -> int:
    count = 0
    with _private_file(path) as out, conn.cursor(name=f"pgflow_export_{name}") as cur:
        cur.itersize = 2000
        cur.execute(sqlfiles.statement(QUERIES, name), {"flow_slug": flow_slug})
        for (line,) in cur:
            out.write(line)
            out.write("\n")
            count += 1
    return count


def _private_file(path: Path) -> TextIO:
    """A new text file only the current user may read (it may hold run inputs and outputs)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    return os.fdopen(fd, "w", encoding="utf-8")


def _export(conn: psycopg.Connection, flow_slug: str, directory: Path) -> dict[str, Any]:
    """Write the definition and run history (inside the deletion's transaction, after its locks)."""
    definition = scalar(conn.execute(sqlfiles.statement(QUERIES, "export_definition"), {"flow_slug": flow_slug}))
    with _private_file(directory / "definition.json") as out:
        out.write(definition)
        out.write("\n")
    counts = {
        "runs": _write_lines(conn, "export_runs", flow_slug, directory / "runs.jsonl"),
        "step_states": _write_lines(conn, "export_step_states", flow_slug, directory / "step_states.jsonl"),
        "step_tasks": _write_lines(conn, "export_step_tasks", flow_slug, directory / "step_tasks.jsonl"),
    }
    manifest = {
        "kind": EXPORT_KIND, "version": EXPORT_VERSION, "flow_slug": flow_slug,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": list(EXPORT_FILES), "rows": counts,
        "note": "run inputs and outputs are included; queue message bodies are not",
    }
    with _private_file(directory / "manifest.json") as out:
        json.dump(manifest, out, indent=2)
        out.write("\n")
    return {"directory": str(directory), "files": list(EXPORT_FILES), "rows": counts}


def drop(
    conn: psycopg.Connection,
    flow_slug: str,
    *,
    force: bool = False,
    export_dir: Path | None = None,
    lock_timeout: float = 10.0,
    attempts: int = 3,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
) -> DropResult:
    """Delete ``flow_slug`` in one transaction, then check that nothing of it is left.

    Args:
        conn: autocommit connection.
        flow_slug: exact slug.
        force: passed to ``pgflow.drop_flow``: delete even while workers are live or runs started.
        export_dir: an empty directory (:func:`prepare_export_dir`) for the export, written under the
            deletion's locks before anything is deleted; a failed export rolls everything back.
        lock_timeout: seconds any lock may be waited for (runs held by workers, queue tables).
        attempts: transactions tried on lock timeouts and deadlocks (the export is rewritten each time).
        on_retry: called as ``on_retry(attempt, error, sleep_seconds)`` before a retry.

    Returns:
        The :class:`DropResult`; ``leftovers`` lists anything the check after the commit found.

    Raises:
        psycopg.Error: PF004 queue problems, PF006 unknown flow, PF008 still active, 42501 not allowed
            (the CLI maps them); nothing was deleted.
        LockTimeout: every attempt timed out on a lock (exit 4); nothing was deleted.
    """

    def attempt() -> tuple[dict[str, Any], dict[str, Any] | None, float]:
        started = time.monotonic()
        with transaction(conn, lock_timeout=lock_timeout, statement_timeout=None):
            exported = None
            if export_dir is not None:
                conn.execute(sqlfiles.statement(QUERIES, "lock"), {"flow_slug": flow_slug})
                exported = _export(conn, flow_slug, export_dir)
            doc = scalar(conn.execute(sqlfiles.statement(QUERIES, "drop"), {"flow_slug": flow_slug, "force": force}))
        return doc, exported, time.monotonic() - started

    doc, exported, seconds = retry_on_lock(attempt, attempts=attempts, on_retry=on_retry)
    with conn.cursor(row_factory=dict_row) as cur:
        left = cur.execute(sqlfiles.statement(QUERIES, "leftovers"),
                           {"flow_slug": flow_slug, "queues": [q["queue_name"] for q in doc["queues"]]}).fetchall()
    deleted = {table: int(doc["deleted"].get(table, 0)) for table in TABLES}
    return DropResult(
        deleted=deleted, queues=doc["queues"], workers_told_to_stop=int(doc["workers_told_to_stop"]),
        activity=doc["activity"], forced=bool(doc["forced"]), export=exported,
        leftovers=[f"{row['what']}: {row['n']}" for row in left], seconds=seconds,
    )

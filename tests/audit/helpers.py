"""Small helpers shared by the audit tests."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import psycopg

from pgflow_cli.operations.audit import AuditReport, run_audit
from tests.support.cli import CliResult, run_cli


def audit(database, flow_filter: Iterable[str] | None = None, **kwargs) -> AuditReport:
    """Run the audit in-process against a test database."""
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        return run_audit(conn, flow_filter, **kwargs)


def keys(report: AuditReport) -> set[tuple]:
    """Findings as comparable tuples: (check_id, flow_slug, step_slug, object_name, reasons)."""
    return {(f.check_id, f.flow_slug, f.step_slug, f.object_name, f.reasons) for f in report.findings}


def cli(database, *args: str) -> CliResult:
    """``pgflow audit --dsn <database> ARGS`` in a subprocess."""
    return run_cli("audit", "--dsn", database.conninfo, *args)


def cli_json(database, *args: str) -> tuple[CliResult, dict]:
    result = cli(database, "--format", "json", *args)
    return result, json.loads(result.stdout)


def define_flow(conn: psycopg.Connection, flow_slug: str, steps: Sequence[str] = ()) -> None:
    """Create a flow with its queue and steps the way the baseline schema does.

    Uses ``pgflow.create_flow``/``add_step`` when the baseline runtime (0002) is installed;
    otherwise writes the same rows directly and creates the queue with ``pgmq.create``
    (named exactly like the flow, as the released ``create_flow`` does).
    """
    has_functions = conn.execute(
        "SELECT to_regprocedure('pgflow.create_flow(text,integer,integer,integer)') IS NOT NULL"
    ).fetchone()[0]
    if has_functions:
        conn.execute("SELECT pgflow.create_flow(%s)", (flow_slug,))
        previous: list[str] = []
        for step in steps:
            conn.execute("SELECT pgflow.add_step(%s, %s, %s::text[])", (flow_slug, step, previous[-1:]))
            previous.append(step)
        return
    conn.execute("INSERT INTO pgflow.flows (flow_slug) VALUES (%s)", (flow_slug,))
    conn.execute(
        "SELECT pgmq.create(%s) WHERE NOT EXISTS (SELECT 1 FROM pgmq.meta WHERE queue_name = %s)",
        (flow_slug, flow_slug),
    )
    for index, step in enumerate(steps):
        conn.execute(
            "INSERT INTO pgflow.steps (flow_slug, step_slug, step_index, deps_count) VALUES (%s, %s, %s, %s)",
            (flow_slug, step, index, 1 if index else 0),
        )
        if index:
            conn.execute(
                "INSERT INTO pgflow.deps (flow_slug, dep_slug, step_slug) VALUES (%s, %s, %s)",
                (flow_slug, steps[index - 1], step),
            )


def insert_task(conn: psycopg.Connection, flow_slug: str, step_slug: str, message_id: int | None,
                *, status: str = "completed") -> None:
    """Insert a run with one step state and one task holding ``message_id`` (DB surgery for hazards)."""
    run_status = "completed" if status == "completed" else "started"
    run_id = conn.execute(
        "INSERT INTO pgflow.runs (flow_slug, status, input, remaining_steps, completed_at) "
        "VALUES (%s, %s, '{}'::jsonb, 0, CASE WHEN %s = 'completed' THEN now() END) RETURNING run_id",
        (flow_slug, run_status, run_status),
    ).fetchone()[0]
    step_status = "completed" if status == "completed" else "started"
    conn.execute(
        "INSERT INTO pgflow.step_states (flow_slug, run_id, step_slug, status, remaining_tasks, initial_tasks, "
        "started_at, completed_at) VALUES (%s, %s, %s, %s, %s, 1, now(), CASE WHEN %s = 'completed' THEN now() END)",
        (flow_slug, run_id, step_slug, step_status, 0 if step_status == "completed" else 1, step_status),
    )
    conn.execute(
        "INSERT INTO pgflow.step_tasks (flow_slug, run_id, step_slug, message_id, status, attempts_count, "
        "started_at, completed_at) VALUES (%s, %s, %s, %s, %s, 1, "
        "CASE WHEN %s <> 'queued' THEN now() END, CASE WHEN %s = 'completed' THEN now() END)",
        (flow_slug, run_id, step_slug, message_id, status, status, status),
    )

"""The application side of the step-queued version: submit runs, reflect failed runs.

pgflow owns queues, polling, claims, visibility, retries and recovery. What stays here:
starting one run per document (in the same transaction as the document insert) and turning
a run that pgflow failed (attempts exhausted) into the document's ``failed`` outcome, because
a handler cannot tell that its attempt is the last one.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg.types.json import Jsonb

from examples.ingest import domain
from examples.ingest.stepqueues.flow import ingest


def setup(conn: psycopg.Connection) -> None:
    """Domain tables (the flow and its queues are created by the first worker)."""
    domain.create_schema(conn)


def submit(conn: psycopg.Connection, documents: list[tuple[int, str]], faults: Sequence[tuple[int, str, str]] = ()) -> None:
    """Insert documents and start one run each, in one transaction."""
    with conn.transaction():
        domain.insert_documents(conn, documents, faults)
        for doc_id, _ in documents:
            conn.execute("SELECT pgflow.start_flow(%s, %s)", (ingest.slug, Jsonb({"doc_id": doc_id})))


def sync_failed_runs(conn: psycopg.Connection) -> int:
    """Mark documents of failed runs ``failed`` (with the failed task's error). Returns how many moved."""
    return conn.execute(
        "UPDATE ingest.documents d SET status = 'failed', updated_at = clock_timestamp(), "
        "       error = coalesce((SELECT left(t.error_message, 500) FROM pgflow.step_tasks t "
        "                         WHERE t.run_id = r.run_id AND t.status = 'failed' LIMIT 1), 'run failed') "
        "FROM pgflow.runs r "
        "WHERE r.flow_slug = %s AND r.status = 'failed' AND (r.input->>'doc_id')::bigint = d.id "
        "  AND d.status NOT IN ('done', 'failed')", (ingest.slug,)).rowcount

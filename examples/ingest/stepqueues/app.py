"""The application side of the step-queued version: submit runs, await them, reflect failed runs.

pgflow owns queues, polling, claims, visibility, retries and recovery; the run client
(:mod:`pgflow_cli.client`) starts and awaits runs. What stays here: starting one run per document
in the same transaction as the document insert, and turning a run that pgflow failed (attempts
exhausted) into the document's ``failed`` outcome with the failed step's error, because a handler
cannot tell that its attempt is the last one.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from examples.ingest import domain
from examples.ingest.stepqueues.flow import ingest
from pgflow_cli.client import Client, RunOutcome, start_runs


def setup(conn: psycopg.Connection) -> None:
    """Domain tables (the flow and its queues are created by the first worker)."""
    domain.create_schema(conn)


def submit(conn: psycopg.Connection, documents: list[tuple[int, str]],
           faults: Sequence[tuple[int, str, str]] = ()) -> dict[str, int]:
    """Insert documents and start one run each, in one transaction. Returns ``{run_id: doc_id}``."""
    with conn.transaction():
        domain.insert_documents(conn, documents, faults)
        runs = start_runs(conn, ingest, [{"doc_id": doc_id} for doc_id, _ in documents])
    return {run.run_id: doc_id for run, (doc_id, _) in zip(runs, documents, strict=True)}


def error_of(outcome: RunOutcome) -> str:
    """The failed step's error, as the document records it."""
    return "; ".join(failure.describe() for failure in outcome.failures) or "run failed"


def settle(conn: psycopg.Connection, client: Client, submitted: dict[str, int], timeout: float | None = None) -> int:
    """Await the submitted runs; as each fails, mark its document ``failed``. Returns how many moved."""
    return sum(domain.mark_failed(conn, submitted[outcome.run_id], error_of(outcome))
               for outcome in client.as_completed(list(submitted), timeout=timeout) if not outcome.ok)

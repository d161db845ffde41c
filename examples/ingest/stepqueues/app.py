"""The application side of the step-queued version: submit runs and await them.

pgflow owns queues, polling, claims, visibility, retries and recovery; the run client
(:mod:`pgflow_cli.client`) starts and awaits runs. What stays here: starting one run per document
in the same transaction as the document insert, and awaiting the runs. A document whose stage
exhausts its attempts is marked ``failed`` by that last attempt's handler (``flow.py``), so nothing
here turns failed runs into document outcomes.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from examples.ingest import domain
from examples.ingest.stepqueues.flow import ingest
from pgflow_cli.client import Client, start_runs


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



def settle(client: Client, submitted: dict[str, int], timeout: float | None = None) -> list[int]:
    """Await the submitted runs (``{run_id: doc_id}``). Returns the documents whose run failed
    (their handlers have marked them ``failed`` already)."""
    return [submitted[outcome.run_id] for outcome in client.as_completed(list(submitted), timeout=timeout)
            if not outcome.ok]

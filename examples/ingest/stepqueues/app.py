"""The application side of the step-queued version: submit runs.

pgflow owns queues, polling, claims, visibility, retries and recovery. What stays here:
starting one run per document (in the same transaction as the document insert). A document
whose stage exhausts its attempts is marked ``failed`` by the last attempt's handler
(``flow.py``), so nothing here watches for failed runs.
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


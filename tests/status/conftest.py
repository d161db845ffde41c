"""Helpers of the status/runs tests: put runs into known states through the real protocol."""

from __future__ import annotations

import json

import psycopg

from pgflow_cli.sandbox.demo import database_protocol
from pgflow_cli.worker.protocol import for_version

STALLED_WORKER = "00000000-0000-4000-8000-0000000057a1"


def validate(document_text: str, schema: str) -> dict:
    """Parse a --format json document and validate it against docs/schemas/<schema>.schema.json
    (with the shared definitions of common.schema.json, tests/support/schemas.py)."""
    from tests.support import schemas

    document = json.loads(document_text)
    schemas.validate(document, schema)
    return document


def claim_one(conn: psycopg.Connection, flow_slug: str, worker_id: str = STALLED_WORKER) -> int:
    """Claim one queued task of a plain flow as a worker that then vanishes; returns how many were claimed."""
    protocol = for_version(database_protocol(conn))
    queue = protocol.queue_name(flow_slug, None)
    protocol.register(conn, worker_id=worker_id, function_name="tests-status", queue_name=queue,
                      flow_slug=flow_slug, step_slug=None)
    ids = protocol.read(conn, queue_name=queue, vt=30, qty=1, max_poll_seconds=1, poll_interval_ms=50)
    assert ids, f"nothing to claim on {queue}"
    outcome = protocol.claim(conn, flow_slug=flow_slug, step_slug=None, queue_name=queue, message_ids=ids,
                             worker_id=worker_id)
    return len(outcome.claimed)


def age_claims(conn: psycopg.Connection, flow_slug: str, seconds: int) -> None:
    """Move the claim time of the flow's started tasks ``seconds`` back (the clock moving on, in a test)."""
    conn.execute("UPDATE pgflow.step_tasks SET started_at = started_at - make_interval(secs => %s), "
                 "queued_at = queued_at - make_interval(secs => %s) "
                 "WHERE flow_slug = %s AND status = 'started'", (seconds, seconds, flow_slug))

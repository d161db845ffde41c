"""The ingestion domain, shared unchanged by both versions of the application.

Documents move through four stages; each stage is one guarded status transition:

=========  ============  ============
stage      from status   to status
=========  ============  ============
fetch      pending       fetched
parse      fetched       parsed
enrich     parsed        enriched
index      enriched      done
=========  ============  ============

Any non-terminal document can become ``failed`` (terminal outcomes: ``done``, ``failed``).
A transition commits only if the document still has the expected status (the domain's claim),
so a redelivered message never applies a stage twice: :func:`run_stage` returns ``"skipped"``.

Fakes (no network): ``doc://N`` sources produce deterministic text, ``missing://N`` is a
permanent "not found" (the document fails at once), and the enrichment provider is an
in-process token bucket that answers "rate limited, retry after S seconds" when empty.
``ingest.faults`` injects a one-time failure (``fail_once``), a failure on every attempt
(``fail_always``), a one-time hang (``hang_once``, for crash tests) or a one-time "rate limited,
retry after 20 s" (``rate_limited_once``) into a stage of a document.

Handlers record every invocation in ``ingest.stage_calls`` and every committed transition in
``ingest.stage_effects``, so tests can count "ran" versus "applied" per document and stage.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import psycopg
from psycopg.types.json import Jsonb

Stage = Literal["fetch", "parse", "enrich", "index"]
STAGES: tuple[Stage, ...] = ("fetch", "parse", "enrich", "index")
TRANSITIONS: dict[str, tuple[str, str]] = {
    "fetch": ("pending", "fetched"),
    "parse": ("fetched", "parsed"),
    "enrich": ("parsed", "enriched"),
    "index": ("enriched", "done"),
}
TERMINAL = ("done", "failed")
WORDS = ("alpha", "berlin", "copper", "delta", "europe", "falcon", "granite", "harbor", "iris", "jupiter")
RATE_LIMIT_RETRY_AFTER = 20.0
"""Seconds the ``rate_limited_once`` fault asks the caller to wait (the provider's Retry-After)."""
ENTITIES = frozenset({"berlin", "europe", "jupiter", "falcon"})

SCHEMA = """
CREATE SCHEMA IF NOT EXISTS ingest;
CREATE TABLE IF NOT EXISTS ingest.documents (
  id bigint PRIMARY KEY,
  source text NOT NULL,
  status text NOT NULL DEFAULT 'pending'
    CHECK (status IN ('pending', 'fetched', 'parsed', 'enriched', 'done', 'failed')),
  content text,
  tokens jsonb,
  entities jsonb,
  error text,
  updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS ingest.index_terms (
  doc_id bigint NOT NULL REFERENCES ingest.documents (id),
  term text NOT NULL,
  PRIMARY KEY (doc_id, term)
);
CREATE TABLE IF NOT EXISTS ingest.stage_calls (
  doc_id bigint NOT NULL, stage text NOT NULL, worker text NOT NULL,
  at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS ingest.stage_effects (
  doc_id bigint NOT NULL, stage text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS ingest.faults (
  doc_id bigint NOT NULL, stage text NOT NULL,
  kind text NOT NULL CHECK (kind IN ('fail_once', 'fail_always', 'hang_once', 'rate_limited_once')),
  PRIMARY KEY (doc_id, stage)
);
"""


class TransientError(RuntimeError):
    """A failure worth retrying (the injected ``fail_once`` fault, a provider hiccup)."""


class RateLimited(TransientError):
    """The provider refused the call; it asks the caller to wait ``retry_after`` seconds."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"provider rate limited; retry after {retry_after:.2f}s")
        self.retry_after = retry_after


class NotFound(Exception):
    """The source does not exist: a permanent failure, the document fails at once."""


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved; thread-safe, in-process."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._tokens = float(burst)
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def take(self) -> float:
        """Take one token. Returns 0 on success, else the seconds until one is available."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            if self._tokens >= 1:
                self._tokens -= 1
                return 0.0
            return (1 - self._tokens) / self.rate


class Provider:
    """A fake enrichment API: rate limited by a token bucket, ``latency`` seconds per call.

    Settings from the environment: ``INGEST_PROVIDER_RATE`` (calls/s, default 50),
    ``INGEST_PROVIDER_BURST`` (default 10), ``INGEST_ENRICH_SECONDS`` (default 0.1).
    """

    def __init__(self) -> None:
        self.bucket = TokenBucket(float(os.environ.get("INGEST_PROVIDER_RATE", "50")),
                                  int(os.environ.get("INGEST_PROVIDER_BURST", "10")))
        self.latency = float(os.environ.get("INGEST_ENRICH_SECONDS", "0.1"))

    def enrich(self, tokens: list[str]) -> list[str]:
        """The entities among ``tokens`` (sorted, distinct). Raises :class:`RateLimited`."""
        wait = self.bucket.take()
        if wait:
            raise RateLimited(wait)
        time.sleep(self.latency)
        return sorted(set(tokens) & ENTITIES)


_provider: Provider | None = None
_provider_lock = threading.Lock()


def provider() -> Provider:
    """The process's provider (one token bucket per process)."""
    global _provider
    with _provider_lock:
        if _provider is None:
            _provider = Provider()
        return _provider


def configure_provider(*, latency: float, rate: float = 1000.0, burst: int = 1000) -> None:
    """Replace this process's provider (benchmarks vary the latency between windows)."""
    global _provider
    with _provider_lock:
        _provider = Provider()
        _provider.latency = latency
        _provider.bucket = TokenBucket(rate, burst)


def conninfo() -> str:
    """The application database: ``$INGEST_DSN``."""
    try:
        return os.environ["INGEST_DSN"]
    except KeyError:
        raise RuntimeError("INGEST_DSN is not set (the application database conninfo)") from None


def create_schema(conn: psycopg.Connection) -> None:
    """Create the domain tables (idempotent)."""
    conn.execute(SCHEMA)


def insert_documents(conn: psycopg.Connection, documents: list[tuple[int, str]],
                     faults: Sequence[tuple[int, str, str]] = ()) -> None:
    """Insert ``(id, source)`` documents as ``pending`` and ``(doc_id, stage, kind)`` faults."""
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO ingest.documents (id, source) VALUES (%s, %s)", documents)
        if faults:
            cur.executemany("INSERT INTO ingest.faults (doc_id, stage, kind) VALUES (%s, %s, %s)", faults)


def sample_documents(n: int) -> list[tuple[int, str]]:
    """``n`` documents; every 10th (ids 10, 20, ...) is a missing source."""
    return [(i, f"missing://{i}" if i % 10 == 0 else f"doc://{i}") for i in range(1, n + 1)]


def _fetch(source: str) -> str:
    kind, _, number = source.partition("://")
    if kind != "doc":
        raise NotFound(f"{source} does not exist")
    n = int(number)
    return " ".join(WORDS[(n * k + k) % len(WORDS)] for k in range(1, 7))


def _compute(stage: str, doc: dict[str, Any]) -> dict[str, Any]:
    if stage == "fetch":
        return {"content": _fetch(doc["source"])}
    if stage == "parse":
        return {"tokens": Jsonb(sorted(set(doc["content"].split())))}
    if stage == "enrich":
        return {"entities": Jsonb(provider().enrich(doc["tokens"]))}
    return {}


def run_stage(stage: str, doc_id: int, worker: str,
              in_transaction: Callable[[psycopg.Connection, str], None] | None = None) -> str:
    """Run one stage of one document: the whole domain side of a task.

    Args:
        stage: one of :data:`STAGES`.
        doc_id: the document.
        worker: who runs it (recorded in ``ingest.stage_calls``).
        in_transaction: called as ``in_transaction(conn, result)`` inside the transaction that
            applies the result (the hand-rolled version sends the next stage's message and
            archives its own there, so the domain change and the queue change commit together).

    Returns:
        ``"done"`` (transition committed), ``"skipped"`` (the document is not in this stage's
        from-status: already applied, or terminal), ``"failed"`` (permanent: marked failed).

    Raises:
        TransientError / RateLimited: retry later; nothing was changed.
    """
    from_status, to_status = TRANSITIONS[stage]
    with psycopg.connect(conninfo(), autocommit=True) as conn:
        conn.execute("INSERT INTO ingest.stage_calls (doc_id, stage, worker) VALUES (%s, %s, %s)",
                     (doc_id, stage, worker))
        fault = conn.execute("DELETE FROM ingest.faults WHERE doc_id = %s AND stage = %s AND kind <> 'fail_always' "
                             "RETURNING kind", (doc_id, stage)).fetchone() or conn.execute(
            "SELECT kind FROM ingest.faults WHERE doc_id = %s AND stage = %s", (doc_id, stage)).fetchone()
        if fault and fault[0] == "hang_once":
            print(f"HANGING {stage} {doc_id}", flush=True)
            time.sleep(3600)
        if fault and fault[0] == "rate_limited_once":
            raise RateLimited(RATE_LIMIT_RETRY_AFTER)
        if fault and fault[0] in ("fail_once", "fail_always"):
            raise TransientError(f"injected failure in {stage} of document {doc_id}")
        row = conn.execute("SELECT source, status, content, tokens FROM ingest.documents WHERE id = %s",
                           (doc_id,)).fetchone()
        if row is None:
            raise LookupError(f"document {doc_id} does not exist")
        doc = dict(zip(("source", "status", "content", "tokens"), row, strict=True))
        if doc["status"] != from_status:
            if in_transaction:
                with conn.transaction():
                    in_transaction(conn, "skipped")
            return "skipped"
        try:
            fields = _compute(stage, doc)
        except NotFound as exc:
            with conn.transaction():
                mark_failed(conn, doc_id, str(exc))
                if in_transaction:
                    in_transaction(conn, "failed")
            return "failed"
        with conn.transaction():
            assignments = "".join(f", {name} = %({name})s" for name in fields)  # names are fixed above
            updated = conn.execute(
                f"UPDATE ingest.documents SET status = %(to)s, updated_at = clock_timestamp(){assignments} "
                "WHERE id = %(id)s AND status = %(from)s",
                {**fields, "to": to_status, "from": from_status, "id": doc_id}).rowcount
            if updated:
                if stage == "index":
                    conn.execute("INSERT INTO ingest.index_terms (doc_id, term) "
                                 "SELECT %s, t FROM jsonb_array_elements_text(%s::jsonb) t",
                                 (doc_id, Jsonb(doc["tokens"])))
                conn.execute("INSERT INTO ingest.stage_effects (doc_id, stage) VALUES (%s, %s)", (doc_id, stage))
            result = "done" if updated else "skipped"
            if in_transaction:
                in_transaction(conn, result)
        return result


def mark_failed(conn: psycopg.Connection, doc_id: int, error: str) -> bool:
    """Move a non-terminal document to ``failed`` with ``error``. Returns whether it moved."""
    return conn.execute(
        "UPDATE ingest.documents SET status = 'failed', error = %s, updated_at = clock_timestamp() "
        "WHERE id = %s AND status NOT IN ('done', 'failed')", (error[:500], doc_id)).rowcount == 1


def outcomes(conn: psycopg.Connection) -> list[tuple[Any, ...]]:
    """Every document's final state, comparable across versions: id, status, tokens, entities, terms, error."""
    return conn.execute(
        "SELECT d.id, d.status, d.tokens, d.entities, "
        "       (SELECT array_agg(term ORDER BY term) FROM ingest.index_terms WHERE doc_id = d.id), "
        "       d.error IS NOT NULL "
        "FROM ingest.documents d ORDER BY d.id").fetchall()


def pending_count(conn: psycopg.Connection) -> int:
    """Documents not yet in a terminal status."""
    row = conn.execute("SELECT count(*) FROM ingest.documents WHERE status NOT IN ('done', 'failed')").fetchone()
    assert row is not None
    return int(row[0])


def status_counts(conn: psycopg.Connection) -> dict[str, int]:
    """``{status: documents}``."""
    return dict(conn.execute("SELECT status, count(*) FROM ingest.documents GROUP BY status ORDER BY 1").fetchall())

"""Hand-rolled ingestion: one PGMQ queue per stage, the application's own polling workers.

What the application owns here (and the step-queued version hands to pgflow): queue creation,
the message format, a polling loop per stage with a thread pool, visibility timeouts long enough
for each stage, moving a document to the next stage's queue in the same transaction as its
domain transition, retries with backoff from ``read_ct``, giving up after ``MAX_ATTEMPTS``,
and what to do with a message it does not understand.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from examples.ingest import domain

log = logging.getLogger("ingest.handrolled")

QUEUES = {stage: f"ingest_{stage}" for stage in domain.STAGES}
NEXT: dict[domain.Stage, domain.Stage | None] = {"fetch": "parse", "parse": "enrich", "enrich": "index", "index": None}
MAX_ATTEMPTS = 3
BASE_DELAY = 1
"""Seconds; retry n waits BASE_DELAY * 2**(n-1) unless the provider said Retry-After."""


def visibility_timeout(stage: str) -> int:
    """Seconds a read message stays hidden: longer than the stage's slowest handler.

    ``INGEST_VT_<STAGE>`` overrides (the crash test shortens it); enrich defaults to 30 s.
    """
    return int(os.environ.get(f"INGEST_VT_{stage.upper()}", "30" if stage == "enrich" else "10"))


def setup(conn: psycopg.Connection) -> None:
    """Domain tables and the four stage queues (idempotent)."""
    domain.create_schema(conn)
    for queue in QUEUES.values():
        conn.execute("SELECT pgmq.create(%s)", (queue,))


def submit(conn: psycopg.Connection, documents: list[tuple[int, str]], faults: Sequence[tuple[int, str, str]] = ()) -> None:
    """Insert documents and enqueue each on the fetch queue, in one transaction."""
    with conn.transaction():
        domain.insert_documents(conn, documents, faults)
        for doc_id, _ in documents:
            conn.execute("SELECT pgmq.send(%s, %s)", (QUEUES["fetch"], Jsonb({"doc_id": doc_id})))


class StageWorker:
    """Polls one stage's queue and runs up to ``concurrency`` documents at once.

    Args:
        stage: the stage it serves.
        dsn: the application database.
        concurrency: handler threads.
    """

    def __init__(self, stage: domain.Stage, dsn: str, concurrency: int = 4) -> None:
        self.stage, self.dsn, self.concurrency = stage, dsn, concurrency
        self.queue = QUEUES[stage]
        self.vt = visibility_timeout(stage)
        self.worker = f"{stage}-{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._free = threading.Semaphore(concurrency)
        self._executor = ThreadPoolExecutor(concurrency, thread_name_prefix=self.worker)

    def run(self) -> None:
        """Poll until :meth:`stop`; then wait for in-flight documents."""
        log.info("worker %s polling %s (vt %ss)", self.worker, self.queue, self.vt)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                free = 0
                while self._free.acquire(blocking=False):
                    free += 1
                if not free:
                    time.sleep(0.02)
                    continue
                rows = conn.execute("SELECT msg_id, read_ct, message FROM pgmq.read(%s, %s, %s)",
                                    (self.queue, self.vt, free)).fetchall()
                for _ in range(free - len(rows)):
                    self._free.release()
                for row in rows:
                    self._executor.submit(self._handle, *row)
                if not rows:
                    self._stop.wait(0.05)
        self._executor.shutdown(wait=True)
        log.info("worker %s stopped", self.worker)

    def stop(self) -> None:
        """Stop polling; :meth:`run` returns after in-flight documents finish."""
        self._stop.set()

    def _handle(self, msg_id: int, read_ct: int, body: Any) -> None:
        try:
            self._process(msg_id, read_ct, body)
        except Exception:
            log.exception("worker %s: message %s of %s left for redelivery", self.worker, msg_id, self.queue)
        finally:
            self._free.release()

    def _process(self, msg_id: int, read_ct: int, body: Any) -> None:
        doc_id = body.get("doc_id") if isinstance(body, dict) else None
        if not isinstance(doc_id, int):
            log.warning("worker %s: archived message %s of %s: not a document message", self.worker, msg_id, self.queue)
            self._archive(msg_id)
            return

        def finish(conn: psycopg.Connection, result: str) -> None:
            following = NEXT[self.stage]
            if result == "done" and following:
                conn.execute("SELECT pgmq.send(%s, %s)", (QUEUES[following], Jsonb({"doc_id": doc_id})))
            conn.execute("SELECT pgmq.archive(%s, %s::bigint)", (self.queue, msg_id))

        try:
            domain.run_stage(self.stage, doc_id, self.worker, finish)
        except LookupError:
            log.warning("worker %s: archived message %s of %s: unknown document", self.worker, msg_id, self.queue)
            self._archive(msg_id)
        except domain.TransientError as exc:
            self._retry(msg_id, read_ct, doc_id, exc)

    def _retry(self, msg_id: int, read_ct: int, doc_id: int, exc: domain.TransientError) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn, conn.transaction():
            if read_ct >= MAX_ATTEMPTS:
                domain.mark_failed(conn, doc_id, f"{self.stage}: {exc}")
                conn.execute("SELECT pgmq.archive(%s, %s::bigint)", (self.queue, msg_id))
                return
            delay = exc.retry_after if isinstance(exc, domain.RateLimited) else BASE_DELAY * 2 ** (read_ct - 1)
            conn.execute("SELECT pgmq.set_vt(%s, %s::bigint, %s)", (self.queue, msg_id, max(1, round(delay))))

    def _archive(self, msg_id: int) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("SELECT pgmq.archive(%s, %s::bigint)", (self.queue, msg_id))


def serve(stage: domain.Stage, dsn: str, concurrency: int) -> None:
    """Run one stage worker in this process until SIGTERM/SIGINT."""
    worker = StageWorker(stage, dsn, concurrency)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: worker.stop())
    worker.run()

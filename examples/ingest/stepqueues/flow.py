"""The ingestion flow: four steps, each on its own private queue (``with_step_queues``).

Workers: ``pgflow worker examples.ingest.stepqueues.flow:ingest --step enrich`` (one pool per
step). Handlers read ``$INGEST_DSN`` for the domain tables (see :mod:`examples.ingest.domain`).
Retries, backoff, attempts, visibility and crash recovery are pgflow's; a permanent failure
(a missing source) is the domain's and fails the document at once. A rate-limited provider's
"retry after S seconds" becomes the next attempt's delay (``RetryLater``). When a stage's last
attempt fails, its handler marks the document ``failed`` itself (``ctx.is_last_attempt``) before
pgflow fails the run, so the document never waits for anyone to notice the failed run.
"""

from __future__ import annotations

from typing import Literal, TypedDict

import psycopg

from examples.ingest import domain
from pgflow_cli.worker import Flow, RetryLater, TaskContext, with_step_queues

Steps = Literal["fetch", "parse", "enrich", "index"]


class DocInput(TypedDict):
    doc_id: int


class StageOutput(TypedDict):
    doc_id: int
    result: str


def _stage(stage: domain.Stage, doc_id: int, ctx: TaskContext) -> StageOutput:
    """Run one stage; a transient failure is raised for pgflow to retry (no earlier than the
    provider asked, when it was rate limited), except on the last attempt, where the document is
    marked ``failed`` first (in this attempt, not afterwards)."""
    try:
        return {"doc_id": doc_id, "result": domain.run_stage(stage, doc_id, ctx.worker_id)}
    except domain.TransientError as exc:
        if ctx.is_last_attempt:
            with psycopg.connect(domain.conninfo(), autocommit=True) as conn:
                domain.mark_failed(conn, doc_id, f"{stage}: {exc}")
            raise
        if isinstance(exc, domain.RateLimited):
            raise RetryLater(exc.retry_after) from exc
        raise


def fetch(run_input: DocInput, ctx: TaskContext) -> StageOutput:
    """Root step: input is the run input ``{"doc_id"}``; returns the stage result for the next step."""
    return _stage("fetch", run_input["doc_id"], ctx)


def parse(deps: dict[str, StageOutput], ctx: TaskContext) -> StageOutput:
    """Input ``{"fetch": StageOutput}``. ``parse``, ``enrich`` and ``index`` raise to retry."""
    return _stage("parse", deps["fetch"]["doc_id"], ctx)


def enrich(deps: dict[str, StageOutput], ctx: TaskContext) -> StageOutput:
    return _stage("enrich", deps["parse"]["doc_id"], ctx)


def index(deps: dict[str, StageOutput], ctx: TaskContext) -> StageOutput:
    return _stage("index", deps["enrich"]["doc_id"], ctx)


def build(slug: str = "ingestDoc") -> Flow[Steps]:
    """The flow (plain); :data:`ingest` is its step-queued deployment."""
    return (
        Flow[Steps](slug, max_attempts=3, base_delay=1, timeout=10)
        .step("fetch", fetch)
        .step("parse", parse, depends_on=["fetch"])
        .step("enrich", enrich, depends_on=["parse"], timeout=5)
        .step("index", index, depends_on=["enrich"])
    )


ingest = with_step_queues(build())

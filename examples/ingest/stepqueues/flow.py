"""The ingestion flow: four steps, each on its own private queue (``with_step_queues``).

Workers: ``pgflow worker examples.ingest.stepqueues.flow:ingest --step enrich`` (one pool per
step). Handlers read ``$INGEST_DSN`` for the domain tables (see :mod:`examples.ingest.domain`).
Retries, backoff, attempts, visibility and crash recovery are pgflow's; a permanent failure
(a missing source) is the domain's and fails the document at once.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from examples.ingest import domain
from pgflow_cli.worker import Flow, TaskContext, with_step_queues

Steps = Literal["fetch", "parse", "enrich", "index"]


class DocInput(TypedDict):
    doc_id: int


class StageOutput(TypedDict):
    doc_id: int
    result: str


def fetch(run_input: DocInput, ctx: TaskContext) -> StageOutput:
    """Root step: input is the run input ``{"doc_id"}``; returns the stage result for the next step."""
    return {"doc_id": run_input["doc_id"], "result": domain.run_stage("fetch", run_input["doc_id"], ctx.worker_id)}


def parse(deps: dict[str, StageOutput], ctx: TaskContext) -> StageOutput:
    """Input ``{"fetch": StageOutput}``. ``parse``, ``enrich`` and ``index`` raise to retry."""
    doc_id = deps["fetch"]["doc_id"]
    return {"doc_id": doc_id, "result": domain.run_stage("parse", doc_id, ctx.worker_id)}


def enrich(deps: dict[str, StageOutput], ctx: TaskContext) -> StageOutput:
    doc_id = deps["parse"]["doc_id"]
    return {"doc_id": doc_id, "result": domain.run_stage("enrich", doc_id, ctx.worker_id)}


def index(deps: dict[str, StageOutput], ctx: TaskContext) -> StageOutput:
    doc_id = deps["enrich"]["doc_id"]
    return {"doc_id": doc_id, "result": domain.run_stage("index", doc_id, ctx.worker_id)}


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

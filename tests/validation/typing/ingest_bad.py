"""Mistakes a developer can make with the ingestion flow; the test records which mypy catches.

Lines ending ``# caught`` must be reported by mypy; ``# missed`` lines are mistakes the Python
API cannot see today (handler inputs are untyped; see docs/validation.md "Types").
"""

from examples.ingest.stepqueues.flow import StageOutput, Steps, enrich, ingest
from pgflow_cli.worker import Flow, TaskContext, flow_worker, step_worker

step_worker(ingest, "enrihc", "dbname=x", function_name="f")  # caught
flow_worker(ingest, "dbname=x", function_name="f")  # caught
Flow[Steps]("other").step("fetch", enrich).step("prase", enrich)  # caught
Flow[Steps]("other2").step("fetch", enrich).step("parse", enrich, depends_on=["fecth"])  # caught
ingest.queue_for("indx")  # caught


def wrong_key(deps: dict[str, StageOutput], ctx: TaskContext) -> StageOutput:
    return {"doc_id": deps["fecth"]["doc_id"], "result": "x"}  # missed


def wrong_input(run_input: int, ctx: TaskContext) -> int:
    return run_input + 1


Flow[Steps]("other3").step("fetch", wrong_input)  # missed
Flow[Steps]("other4").step("fetch", lambda x, y, z: x)  # caught

# Type-checked by tests/stage2/test_flow_api.py::test_type_checker_sees_step_slugs; must pass mypy.
from typing import Literal

from pgflow_cli.worker import Flow, StepQueuedFlow, flow_worker, step_worker, with_step_queues

Steps = Literal["fetch", "parse"]
scrape = Flow[Steps]("scrape").step("fetch", lambda i, c: 1).step("parse", lambda d, c: 2, depends_on=["fetch"])
queued: StepQueuedFlow[Steps] = with_step_queues(scrape)
parse_worker = step_worker(queued, "parse", "", function_name="scrape-parse")
plain = Flow("plain").step("a", lambda i, c: 1)
plain_worker = flow_worker(plain, "", function_name="plain-worker")

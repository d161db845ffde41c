# Type-checked by tests/stage2/test_flow_api.py; every line marked "error" must be a mypy error.
from typing import Literal

from pgflow_cli.worker import Flow, flow_worker, step_worker, with_step_queues

Steps = Literal["fetch", "parse"]
scrape = Flow[Steps]("scrape").step("fetch", lambda i, c: 1)
scrape.step("prase", lambda d, c: 2)  # error: misspelt step
queued = with_step_queues(scrape)
step_worker(queued, "prase", "", function_name="x")  # error: not a step of the flow
flow_worker(queued, "", function_name="y")  # error: a step-queued flow needs step workers
plain = Flow("plain").step("a", lambda i, c: 1)
step_worker(plain, "a", "", function_name="z")  # error: a plain flow has no step workers

"""Flows that tests start with the real `pgflow worker MODULE:FLOW` command.

``plain``: a plain two-step flow. ``queued``: the same steps with private step queues.
``not_a_flow``: something else, for the refusal tests. Handlers return at once.
"""

from typing import Literal

from pgflow_cli.worker import Flow, with_step_queues


def first(run_input, ctx):
    return {"first": run_input}


def second(deps, ctx):
    return {"second": deps["first"]}


def build(slug: str) -> Flow[Literal["first", "second"]]:
    return Flow[Literal["first", "second"]](slug).step("first", first).step("second", second, depends_on=["first"])


plain = build("cliPlain")
queued = with_step_queues(build("cliQueued"))
not_a_flow = {"slug": "nope"}

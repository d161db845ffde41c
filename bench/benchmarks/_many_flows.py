"""The flows the ``many_workers`` benchmark's worker processes serve (``pgflow worker
bench.benchmarks._many_flows:plain`` / ``:mapped``). The leading underscore keeps ``bench.run`` from
running this module as a benchmark. Handlers do nothing, so the database work is what is measured."""

from __future__ import annotations

from typing import Any

from pgflow_cli.worker import Flow, TaskContext

PLAIN = "manyPlain"
MAPPED = "manyMap"


def _noop(value: Any, ctx: TaskContext) -> None:
    return None


def _element(value: Any, ctx: TaskContext) -> Any:
    return value


def _count(deps: Any, ctx: TaskContext) -> int:
    return len(deps["each"])


plain = (
    Flow(PLAIN)
    .step("first", _noop)
    .step("second", _noop, depends_on=["first"])
    .step("third", _noop, depends_on=["second"])
)
"""Three steps in a row: every run is 3 tasks, one after the other."""

mapped = Flow(MAPPED).map("each", _element).step("total", _count, depends_on=["each"])
"""A root map (one task per element of the run's input array) and one step after it."""

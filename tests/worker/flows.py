"""Flow definitions shared by the in-process tests and the worker subprocess (same shape in both,
so a fresh in-process worker verifies the definition a subprocess compiled)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pgflow_cli.worker import Flow

Handler = Callable[[Any, Any], Any]

PROC_FLOW = "procFlow"
"""Flow served by tests/worker/proc_worker.py: ``work`` (timeout 1 s) -> ``after``."""


def proc_flow(work: Handler, after: Handler) -> Flow:
    """``work`` is the step a test blocks, kills or drains; its 1-second timeout makes it
    stalled 31 s after its claim (tests move ``started_at`` back instead of waiting)."""
    return (
        Flow(PROC_FLOW, max_attempts=3, base_delay=0)
        .step("work", work, timeout=1)
        .step("after", after, depends_on=["work"])
    )


def diamond_map_flow(slug: str, rec, gate=None) -> Flow:
    """seed -> (part: map over seed's list, side) -> join. ``gate`` (if any) runs inside seed."""

    def seed(run_input, ctx):
        if gate is not None:
            gate()
        return list(range(run_input["n"]))

    return (
        Flow(slug)
        .step("seed", rec.wrap(seed))
        .map("part", rec.wrap(lambda item, ctx: item * 2), array="seed")
        .step("side", rec.wrap(lambda deps, ctx: len(deps["seed"])), depends_on=["seed"])
        .step("join", rec.wrap(lambda deps, ctx: {"sum": sum(deps["part"]), "n": deps["side"]}),
              depends_on=["part", "side"])
    )

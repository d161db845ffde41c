"""Flows that tests start with the real `pgflow worker MODULE:FLOW` command.

``plain``: a plain two-step flow. ``queued``: the same steps with private step queues.
``not_a_flow``: something else, for the refusal tests. Handlers return at once, except those of
``blocking`` and ``async_blocking`` (they hold their task) and ``failing`` (it always raises).
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


def hold(run_input, ctx):
    """Blocks until the file named by $PGFLOW_TEST_RELEASE exists (a task that keeps its worker busy)."""
    import os
    import time
    from pathlib import Path

    print(f"HOLDING {ctx.run_id}", flush=True)
    release = Path(os.environ["PGFLOW_TEST_RELEASE"])
    deadline = time.monotonic() + 300
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return {"held": True}


blocking = Flow("cliBlocking").step("hold", hold)


async def hold_async(run_input, ctx):
    """Sleeps for 5 minutes on the worker's event loop; says when it is cancelled."""
    import asyncio

    print(f"HOLDING {ctx.run_id}", flush=True)
    try:
        await asyncio.sleep(300)
    except asyncio.CancelledError:
        print(f"CANCELLED {ctx.run_id}", flush=True)
        raise
    return {"held": True}


async_blocking = Flow("cliAsyncBlocking").step("hold", hold_async)


def fail_each_time(run_input, ctx):
    raise ValueError(f"row {ctx.attempt} is bad")


failing = Flow("cliFailing", max_attempts=2, base_delay=0).step("parse", fail_each_time)

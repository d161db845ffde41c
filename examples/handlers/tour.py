"""One flow that uses every handler feature of the reference worker (docs/handlers.md).

Run it against a database with pgflow installed (the sandbox works)::

    python -m examples.handlers --sandbox            # or --dsn CONNINFO
    pgflow worker examples/handlers/tour.py:tour --sandbox --log-tracebacks   # the same flow, served alone

Steps: ``fetch`` (a ``def`` handler that fails on its first attempt), ``pages`` (an ``async def``
map step reading the run input), ``summary`` (the deadline, and the run input from a dependent
step), ``notify`` (an ``async def`` step that watches the stop signal), ``items`` and ``enrich`` (a
rate-limited provider answered with ``RetryLater``, a missing item with ``FailNow``; the step is
skipped rather than failing the run when an item fails for good, and its other tasks with it: the
rate-limited item, still waiting for its retry five seconds later, is skipped too).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from pgflow_cli.worker import FailNow, Flow, RetryLater, TaskContext


class RateLimited(Exception):
    """What a provider says when it wants the caller to come back later."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"rate limited; retry after {retry_after:g}s")
        self.retry_after = retry_after


_calls: dict[str, int] = {}
_calls_lock = threading.Lock()


def _count(key: str) -> int:
    with _calls_lock:
        _calls[key] = _calls.get(key, 0) + 1
        return _calls[key]


# --8<-- [start:attempts]
def fetch(run_input: dict[str, Any], ctx: TaskContext) -> list[int]:
    """A flaky source: the first attempt fails and pgflow retries it (attempt 1 of 3)."""
    if ctx.attempt == 1:
        raise ConnectionError(f"source {run_input['source']} timed out")
    if ctx.is_last_attempt:
        print(f"fetch: last attempt ({ctx.attempt}/{ctx.max_attempts})")  # e.g. record the outcome in your tables
    return list(range(run_input["pages"]))
# --8<-- [end:attempts]


# --8<-- [start:async]
async def page(index: int, ctx: TaskContext) -> str:
    """A map task on the worker's event loop: many pages wait on the network at once."""
    run_input = await ctx.flow_input_async()  # the run input, read once per run, from any step
    await asyncio.sleep(0.05)  # e.g. an aiohttp request
    return f"page {index} of {run_input['source']}"
# --8<-- [end:async]


# --8<-- [start:deadline]
def summary(deps: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """A dependent step: its input is its dependencies' outputs; the run input is one property away."""
    pages = deps["pages"]
    if ctx.seconds_left() < 1:  # close to the step's timeout: hand over what is done
        pages = pages[:1]
    return {"source": ctx.flow_input["source"], "pages": len(pages), "deadline": ctx.deadline.isoformat()}
# --8<-- [end:deadline]


# --8<-- [start:stop]
async def notify(deps: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Waits a little before it sends, but gives up at once if the work is no longer wanted
    (the worker drains, or the run already failed)."""
    if await ctx.stop.wait_async(timeout=0.2):
        return {"sent": False, "why": ctx.stop.reason}
    return {"sent": True, "to": ctx.flow_input["notify"]}
# --8<-- [end:stop]


# --8<-- [start:directives]
def enrich(item: str, ctx: TaskContext) -> dict[str, str]:
    """A rate-limited provider decides when to retry; a missing item fails at once."""
    if item == "missing":
        raise FailNow(f"item {item!r} does not exist")  # no retry can fix it
    if _count(f"{ctx.run_id}/{ctx.task_index}") == 1:
        try:
            raise RateLimited(retry_after=5)  # e.g. HTTP 429 with Retry-After: 5
        except RateLimited as exc:
            raise RetryLater(exc.retry_after) from exc
    return {"item": item, "entity": item.upper()}
# --8<-- [end:directives]


def items(run_input: dict[str, Any], ctx: TaskContext) -> list[str]:
    return list(run_input["items"])


tour = (
    Flow("handlerTour", max_attempts=3, base_delay=1)
    .step("fetch", fetch)
    .map("pages", page, array="fetch")
    .step("summary", summary, depends_on=["pages"])
    .step("notify", notify, depends_on=["summary"])
    .step("items", items)
    .map("enrich", enrich, array="items", when_exhausted="skip")
)
"""The tour flow: ``pgflow worker examples/handlers/tour.py:tour``."""

RUN_INPUT = {"source": "news", "pages": 3, "notify": "ops@example.com", "items": ["berlin", "missing"]}
"""What ``python -m examples.handlers`` starts the flow with."""

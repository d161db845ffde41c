"""Two small flows of an application, tested in test_flows.py with pgflow_cli.testing."""

from __future__ import annotations

from typing import Any, Literal

from pgflow_cli.worker import Flow, TaskContext


def full_name(run_input: dict[str, Any], ctx: TaskContext) -> str:
    return f"{run_input['first']} {run_input['last']}"


def greeting(deps: dict[str, Any], ctx: TaskContext) -> str:
    return f"Hello, {deps['fullName']}!"


greet = (
    Flow[Literal["fullName", "greeting"]]("greetUser")
    .step("fullName", full_name)
    .step("greeting", greeting, depends_on=["fullName"])
)


def charge(order: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    if order["amount"] > 1000:
        raise ValueError(f"amount {order['amount']} is over the limit")
    return {"charged": order["amount"]}


def ship(deps: dict[str, Any], ctx: TaskContext) -> str:
    return f"shipped after charging {deps['charge']['charged']}"


# base_delay=0: a failing charge is retried at once, so the failure test does not wait for backoff
order = (
    Flow[Literal["charge", "ship"]]("processOrder", max_attempts=2, base_delay=0)
    .step("charge", charge)
    .step("ship", ship, depends_on=["charge"])
)

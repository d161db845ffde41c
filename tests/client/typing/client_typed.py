"""The run client typed by the flow object: mypy must report exactly the lines ending ``# caught``
(tests/client/test_types.py); every ``assert_type`` must hold."""

from typing import Any, Literal

from typing_extensions import assert_type

from pgflow_cli.client import AsyncClient, Client, Run, RunOutcome, RunState, start_run
from pgflow_cli.worker import Flow, with_step_queues

Steps = Literal["fullName", "greeting"]
greet = Flow[Steps]("greetUser").step("fullName", lambda i, c: i).step("greeting", lambda d, c: d,
                                                                       depends_on=["fullName"])


def typed(client: Client, conn: Any) -> None:
    run = client.start(greet, {"first": "Ada"})
    assert_type(run, Run[Steps])
    assert_type(client.wait(run), dict[Steps, Any])
    assert_type(client.outcome(run), RunOutcome[Steps])
    assert_type(client.get(run), RunState[Steps])
    assert_type(client.outcome(run).failures[0].step_slug, Steps)
    assert_type(client.start(with_step_queues(greet), {}), Run[Steps])
    assert_type(start_run(conn, greet, {}), Run[Steps])
    assert_type(client.run(greet, {}), dict[Steps, Any])
    client.get(run).step("greting")  # caught
    client.wait(run)["greting"]  # caught
    by_slug = client.start("greetUser", {})
    assert_type(by_slug, Run[str])
    assert_type(client.wait(by_slug), dict[str, Any])
    client.start(42, {})  # caught


async def typed_async(client: AsyncClient) -> None:
    run = await client.start(greet, {})
    assert_type(run, Run[Steps])
    assert_type(await client.wait(run), dict[Steps, Any])
    async for outcome in client.as_completed([run]):
        assert_type(outcome, RunOutcome[Steps])

"""Run the application's flows to completion against the real pgflow SQL (pgflow_cli.testing)."""

from examples.testing.flows import greet, order
from pgflow_cli.testing import run_flow


def test_greet_user(pgflow_database):
    result = run_flow(greet, {"first": "Ada", "last": "Lovelace"}, pgflow_database)
    assert result.status == "completed"
    assert result.step_outputs == {"fullName": "Ada Lovelace", "greeting": "Hello, Ada Lovelace!"}
    assert result.output == {"greeting": "Hello, Ada Lovelace!"}  # the run output: its leaf steps


def test_an_order_over_the_limit_fails_at_charge(pgflow_database):
    result = run_flow(order, {"amount": 5000}, pgflow_database)
    assert result.status == "failed"
    [failure] = result.failure.failures
    assert failure.step_slug == "charge"
    assert failure.tasks[0].attempts_count == 2  # max_attempts of the flow
    assert "amount 5000 is over the limit" in failure.tasks[0].error_message
    assert result.step_outputs == {}  # ship never ran


def test_an_order_ships(pgflow_database):
    result = run_flow(order, {"amount": 20}, pgflow_database).raise_for_failure()
    assert result.step_outputs["ship"] == "shipped after charging 20"

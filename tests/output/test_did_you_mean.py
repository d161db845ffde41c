"""A mistyped flow or step slug gets a suggestion read from the database's own names."""

from __future__ import annotations

import pytest

from pgflow_cli.errors import ExitCode
from pgflow_cli.operations.names import suggestions
from tests.support.cli import run_cli


def test_suggestions_prefer_letter_case_then_closeness():
    known = ["processOrder", "processOrders", "greetUser", "billing", "Billing"]
    assert suggestions("processorder", known)[0] == "processOrder"
    assert suggestions("billing", known) == ["Billing"]  # never the name itself
    assert suggestions("greetUsr", known) == ["greetUser"]
    assert suggestions("zzz", known) == []


@pytest.fixture
def flows(db):
    conn = db.connect()
    for slug in ("processOrder", "greetUser"):
        conn.execute("SELECT pgflow.create_flow(%s)", (slug,))
    conn.execute("SELECT pgflow.add_step('processOrder', 'approve', step_type => 'single')")
    return db


@pytest.mark.parametrize("args", [
    ["status", "--flow", "procesOrder"],
    ["coverage", "--flow", "procesOrder"],
    ["drop-flow", "procesOrder", "--dry-run"],
    ["fence", "disable", "--flow", "procesOrder", "-m", "x", "--dry-run"],
    ["audit", "--flow", "procesOrder"],
    ["runs", "list", "--flow", "procesOrder"],
])
def test_a_mistyped_flow_slug_gets_a_suggestion(flows, args):
    result = run_cli(*args, "--dsn", flows.conninfo)
    assert result.code == ExitCode.CONFLICT, result.output
    assert "did you mean 'processOrder'?" in result.stderr


def test_a_mistyped_step_of_a_manual_task_gets_a_suggestion(db):
    conn = db.connect()
    from tests.output.helpers import seed

    seed(db)
    run_id = str(conn.execute("SELECT run_id FROM pgflow.runs").fetchone()[0])
    for command in (["task", "show", run_id, "aprove"], ["task", "complete", run_id, "aprove", "--output", "{}"]):
        result = run_cli(*command, "--dsn", db.conninfo)
        assert result.code == ExitCode.CONFLICT, result.output
        assert "did you mean 'approve'?" in result.stderr

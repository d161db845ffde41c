"""Issue 16 item 7: the examples of docs/commands/*.md are what the commands print (tests/output/examples.py),
every command has its page, and docs/exit-codes.md names every command."""

from __future__ import annotations

import pytest

from pgflow_cli import installer
from pgflow_cli.cli import COMMANDS as ROOT_COMMANDS
from tests.conftest import _install
from tests.output import examples as ex
from tests.output.helpers import fixed_database, seed, seed_baseline

EXAMPLES = ex.examples()
COMMANDS = sorted(command.name for command in ROOT_COMMANDS)


@pytest.fixture
def example_db(request, harness):
    state = request.param
    level = None if state == "latest" else installer.BASELINE_VERSION
    template = harness.template("latest" if level is None else "baseline", lambda c: _install(c, level))
    database = fixed_database(harness, template, f"docs_{state}")
    if state == "latest":
        seed(database)
    else:
        seed_baseline(database, blocked=state == "blocked")
    yield database
    harness.drop(database)


@pytest.mark.parametrize(("example", "example_db"), [(e, e.database) for e in EXAMPLES],
                         ids=[e.label for e in EXAMPLES], indirect=["example_db"])
def test_the_examples_are_what_the_command_prints(example, example_db):
    code, out = ex.run(example, example_db.conninfo)
    assert code in (0, 1), out
    expected = ex.normalise("\n".join(example.expected), example_db.conninfo)
    actual = ex.normalise(out, example_db.conninfo)
    assert ex.matches(expected, actual), "\n".join(["expected:", *expected, "", "actual:", *actual])


def test_the_matcher_can_fail():
    assert ex.matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert not ex.matches(["a", "d"], ["a", "b", "d"])
    assert not ex.matches(["a", "..."], ["b"])


@pytest.mark.parametrize("command", [c for c in COMMANDS if c not in ("sandbox", "status", "runs")])
def test_every_command_has_a_page_and_an_exit_code_entry(command):
    page = ex.PAGES / f"{command}.md"
    assert page.is_file(), f"docs/commands/{command}.md is missing"
    text = page.read_text()
    for heading in ("## Synopsis", "## Output", "## Exit codes"):
        assert heading in text, f"{page.name} has no {heading}"
    assert f"`pgflow {command}" in (ex.PAGES.parent / "exit-codes.md").read_text()

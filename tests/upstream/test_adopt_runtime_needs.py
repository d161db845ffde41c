"""Adoption verifies what the runtime needs: a column of an upstream 0.10.0 or 0.14.1 install that
someone dropped or narrowed is mended (where that keeps every row) or the adoption is refused (exit 1)
with the list and nothing changed; ``--assume-release`` never overrides it; never a green adoption
over a runtime that cannot run."""

from __future__ import annotations

import json

import psycopg
import pytest
from psycopg import sql

from pgflow_cli.errors import ExitCode, Refused
from pgflow_cli.installer import shapes
from pgflow_cli.installer.catalog import read_schema_facts
from pgflow_cli.upstream import adopt as adoption
from pgflow_cli.upstream import recognise as rec
from tests.support import upstream_shapes
from tests.support.cli import run_cli
from tests.support.fingerprint import fingerprint
from tests.support.server import label_of

RELEASES = ("0.10.0", "0.14.1")
TABLES = ("flows", "steps", "deps", "runs", "step_states", "step_tasks", "workers")


def _build(conninfo: str, release: str) -> None:
    """The release's shape holding one finished run of a ten-step flow, so that every runtime table but
    ``workers`` has rows (a column of a table with rows cannot be re-added: nobody knows its values)."""
    upstream_shapes.build(conninfo, release)
    upstream_shapes.load_finished_runs(conninfo, 1)


def _runtime_columns(facts: dict[str, str]) -> list[tuple[str, str, str]]:
    """``(table, column, type)`` of every column of ``facts`` (a release's) that the baseline runtime uses."""
    baseline = shapes.shape("baseline")["column"]
    return [(*name.split(".", 1), shapes.Column.parse(detail).type)  # type: ignore[misc]
            for name, detail in sorted(facts.items()) if name in baseline]


@pytest.fixture(scope="module")
def templates(harness, request):
    """``{release: (template, runtime columns)}``."""
    made = {}
    for release in RELEASES:
        template = harness.template(f"shape_{release.replace('.', '')}_loaded", lambda c, r=release: _build(c, r))
        probe = harness.clone(template, label_of(request))
        with psycopg.connect(probe.conninfo) as conn:
            made[release] = (template, _runtime_columns(read_schema_facts(conn)["column"]))
        harness.drop(probe)
    return made


def _counts(conn: psycopg.Connection) -> dict[str, int]:
    return {t: conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier("pgflow", t))).fetchone()[0]
            for t in TABLES if conn.execute("SELECT to_regclass(%s)", (f"pgflow.{t}",)).fetchone()[0]}


def _adopt_after(harness, request, template: str, change: str, release: str) -> tuple[str, list[str]]:
    """Apply ``change`` to a clone of ``template``, adopt it asserting ``release``; ``("mended", lines)``
    or ``("refused", detail)`` (``("impossible", [])`` when PostgreSQL refuses the change). Checks the invariants of each outcome."""
    database = harness.clone(template, label_of(request))
    try:
        with psycopg.connect(database.conninfo, autocommit=True) as conn:
            try:
                conn.execute(change)
            except psycopg.Error:  # PostgreSQL refuses it (a check or view depends on the type)
                return "impossible", []
            before, counts = fingerprint(database.conninfo), _counts(conn)
            try:
                adopted = adoption.adopt(conn, rec.recognise(conn, assume_release=release), assume_release=release)
            except Refused as refused:
                assert fingerprint(database.conninfo) == before, change  # nothing changed
                assert refused.exit_code == ExitCode.FINDINGS and refused.detail, change
                assert "--assume-release does not override" in refused.message
                return "refused", list(refused.detail)
            # adopted: the runtime has everything it needs, every row is still there
            assert shapes.runtime_breaks(shapes.shape("baseline"), read_schema_facts(conn)) == [], change
            assert _counts(conn) == counts, change
            assert adopted.mended, change
            return "mended", adopted.mended
    finally:
        harness.drop(database)


@pytest.mark.parametrize("release", RELEASES)
def test_each_dropped_runtime_column_is_mended_or_refused(harness, request, templates, release):
    outcomes = {}
    template, columns = templates[release]
    for table, column, _type in columns:
        change = f'ALTER TABLE pgflow.{table} DROP COLUMN "{column}" CASCADE'
        outcomes[f"{table}.{column}"], lines = _adopt_after(harness, request, template, change, release)
        if outcomes[f"{table}.{column}"] == "refused":
            assert any(f"missing column {table}.{column} " in line for line in lines), lines
    # a column of a table with rows is refused; of the empty workers table, mended
    assert outcomes["runs.remaining_steps"] == outcomes["step_tasks.error_message"] == "refused"
    assert all(outcome == "mended" for name, outcome in outcomes.items() if name.startswith("workers.")), outcomes
    assert len(outcomes) > 40


@pytest.mark.parametrize("release", RELEASES)
def test_each_narrowed_runtime_column_is_mended_or_refused(harness, request, templates, release):
    outcomes = {}
    template, columns = templates[release]
    for table, column, type_ in columns:
        narrower = {"text": "varchar(20)", "integer": "smallint"}.get(type_)
        if narrower is None:
            continue
        change = f'ALTER TABLE pgflow.{table} ALTER COLUMN "{column}" TYPE {narrower}'
        outcome, lines = _adopt_after(harness, request, template, change, release)
        if outcome == "impossible":
            continue
        outcomes[f"{table}.{column}"] = outcome
        if outcome == "refused":
            assert any(f"changed column {table}.{column}:" in line for line in lines), lines
        else:
            assert narrower == "varchar(20)", (table, column)  # only a varchar is widened back to text
    assert outcomes["step_tasks.error_message"] == "mended" and outcomes["runs.remaining_steps"] == "refused"
    assert len(outcomes) > 25


@pytest.mark.parametrize("release", RELEASES)
def test_a_dropped_runtime_table_is_refused_before_the_adoption_runs(harness, request, templates, release):
    outcome, lines = _adopt_after(harness, request, templates[release][0], "DROP TABLE pgflow.deps CASCADE", release)
    assert outcome == "refused" and "missing table deps: the runtime uses it" in lines


def test_the_command_refuses_over_a_dropped_column_and_status_and_audit_say_broken(harness, request, templates):
    """The issue's case, end to end through the command line: `migrate apply --assume-release` exits 1
    naming the column and changes nothing."""
    database = harness.clone(templates["0.10.0"][0], label_of(request))
    try:
        with psycopg.connect(database.conninfo, autocommit=True) as conn:
            conn.execute("ALTER TABLE pgflow.runs DROP COLUMN remaining_steps")
        before = fingerprint(database.conninfo)
        applied = run_cli("migrate", "apply", "--assume-release", "0.10.0", "--format", "json", "--dsn", database.conninfo)
        assert applied.code == ExitCode.FINDINGS, applied.output
        error = json.loads(applied.stderr)
        assert any("missing column runs.remaining_steps" in line for line in error["detail"]), error
        assert fingerprint(database.conninfo) == before
        for command in (["migrate", "status"], ["audit"]):
            result = run_cli(*command, "--dsn", database.conninfo)
            assert result.code != ExitCode.OK, (command, result.output)
            assert "runs.remaining_steps" in result.output, (command, result.output)
    finally:
        harness.drop(database)

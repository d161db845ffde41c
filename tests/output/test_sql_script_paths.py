"""``migrate apply --sql`` is the engine's run rendered, not a copy: piped into psql it ends where
``migrate apply`` ends (catalog identity, privileges, ledger) from every start that prints a script:
an empty database (level 0), the baseline (tests/output/test_sql_script.py, with roles in
tests/breaker/s4/test_sql_script_levels.py) and a database adopted from a pgflow release. What cannot
be printed (an adoption, the conversion of an earlier build's ledger) is the same steps rendered for
review, every line commented out (tests/upstream/test_adopt_engine.py, tests/output/test_sql_script.py)."""

from __future__ import annotations

import pytest

from pgflow_cli import installer
from pgflow_cli.errors import ExitCode
from tests.layout.catalog import PRIVILEGES, differences, identity
from tests.output.test_sql_script import LEDGER, _psql
from tests.support import published, upstream_shapes
from tests.support.cli import run_cli


def _empty(harness) -> str | None:
    return None


def _release(harness) -> str:
    return harness.template("release_081", lambda c: published.build_schema(c, harness.admin))


def _newest_shape(harness) -> str:
    release = upstream_shapes.SHAPES[-1]
    return harness.template(f"shape_{release.replace('.', '')}", lambda c: upstream_shapes.build(c, release))


def _prepare_empty(database) -> None:
    with database.connect() as conn:
        installer.ensure_pgmq(conn)


def _adopt(database) -> None:
    adopted = run_cli("migrate", "apply", "--target", "2", "--dsn", database.conninfo)
    assert adopted.code == ExitCode.OK, adopted.output


STARTS = {
    "level 0 (PGMQ only)": (_empty, _prepare_empty, ["0001_baseline_schema", "0002_baseline_runtime", "0003_queue_stage"]),
    "adopted pgflow 0.8.1": (_release, _adopt, ["0003_queue_stage"]),
    f"adopted pgflow {upstream_shapes.SHAPES[-1]} (shape)": (_newest_shape, _adopt, ["0003_queue_stage"]),
}


@pytest.mark.parametrize("start", list(STARTS))
def test_the_script_piped_into_psql_ends_where_apply_ends(harness, request, start):
    template_of, prepare, printed = STARTS[start]
    template = template_of(harness)
    by_apply, by_psql = harness.clone(template, "script_a"), harness.clone(template, "script_p")
    try:
        for database in (by_apply, by_psql):
            prepare(database)
        script = run_cli("migrate", "apply", "--sql", "--dsn", by_psql.conninfo)
        assert script.code == ExitCode.OK, script.output
        text = script.stdout
        assert text.startswith("-- pgflow-cli ") and "FOR REVIEW ONLY" not in text, text[:300]
        assert [line.split(" ")[2] for line in text.splitlines() if line.startswith("-- ===== ")] == printed
        assert text.count("BEGIN;") == text.count("COMMIT;") == len(printed)

        ran = _psql(by_psql.conninfo, text)
        assert ran.returncode == 0, ran.stderr[-3000:]
        applied = run_cli("migrate", "apply", "--dsn", by_apply.conninfo)
        assert applied.code == ExitCode.OK, applied.output

        with by_apply.connect() as a, by_psql.connect() as p:
            assert differences(identity(p), identity(a)) == []
            assert p.execute(PRIVILEGES).fetchall() == a.execute(PRIVILEGES).fetchall()
            assert p.execute(LEDGER).fetchall() == a.execute(LEDGER).fetchall()
            assert installer.make_plan(p).pending == []
        again = run_cli("migrate", "apply", "--sql", "--dsn", by_psql.conninfo)
        assert again.code == ExitCode.OK and again.stdout == "" and again.stderr.strip() == "nothing pending"
    finally:
        harness.drop(by_apply)
        harness.drop(by_psql)

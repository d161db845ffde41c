"""Issue 16 item 4: ``migrate apply --sql`` prints SQL that psql runs as is (no placeholders, no abort
phase, phases as comments), or says plainly that the phased path cannot be printed as one script."""

from __future__ import annotations

import re
import subprocess

from psycopg.conninfo import conninfo_to_dict

from pgflow_cli import installer
from pgflow_cli.errors import ExitCode
from pgflow_cli.sandbox import find_bindir
from tests.audit.helpers import define_flow
from tests.conftest import _install
from tests.output.helpers import leave_in_progress
from tests.support.cli import run_cli
from tests.support.fingerprint import _dump

LEDGER = "SELECT version, name, checksum, state, phases_done FROM pgflow.schema_migrations ORDER BY version"


def _psql(conninfo: str, script: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(find_bindir() / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", conninfo, "-f", "-"],
                          input=script, capture_output=True, text=True, timeout=300)


def test_the_script_piped_into_psql_gives_what_apply_gives(harness, baseline_db):
    by_apply = baseline_db
    by_psql = harness.clone(harness.template("baseline", lambda c: _install(c, installer.BASELINE_VERSION)), "sql_psql")
    try:
        for database in (by_apply, by_psql):
            define_flow(database.connect(), "orders", ["validate", "ship"])
        script = run_cli("migrate", "apply", "--sql", "--dsn", by_psql.conninfo)
        assert script.code == ExitCode.OK, script.output
        text = script.stdout
        assert not re.search(r"%\([a-z_]+\)s", text)  # no client-side placeholders left (RAISE's % stays)
        assert "(0::bigint + 4294967294::bigint)" in text  # the backfill covers the whole heap in one call
        assert "-- phase prepare (tx)" in text and "-- phase main (tx)" in text
        assert "-- phase index (notx) is left out" in text
        abort = next(m for m in installer.available_migrations() if m.version == 3).phased.abort
        assert abort is not None and abort.sql.strip() not in text  # no abort phase
        assert text.count("BEGIN;") == text.count("COMMIT;") == len(installer.available_migrations()) - 2

        ran = _psql(by_psql.conninfo, text)
        assert ran.returncode == 0, ran.stderr[-3000:]
        applied = run_cli("migrate", "apply", "--dsn", by_apply.conninfo)
        assert applied.code == ExitCode.OK, applied.output

        assert _dump(by_psql.conninfo, "--schema-only") == _dump(by_apply.conninfo, "--schema-only")
        a, p = by_apply.connect(), by_psql.connect()
        assert p.execute(LEDGER).fetchall() == a.execute(LEDGER).fetchall()
        status = run_cli("migrate", "status", "--dsn", by_psql.conninfo)
        assert status.code == ExitCode.OK and "up to date" in status.stdout
        assert run_cli("migrate", "apply", "--sql", "--dsn", by_psql.conninfo).stderr.strip() == "nothing pending"
    finally:
        harness.drop(by_psql)


def test_the_phased_path_cannot_be_printed_and_says_so(baseline_db):
    result = run_cli("migrate", "apply", "--sql", "--online", "always", "--dsn", baseline_db.conninfo)
    assert result.code == ExitCode.USAGE
    assert "the phased path cannot be printed as one script" in result.stderr
    assert result.stdout == ""


def test_a_migration_in_progress_cannot_be_printed_as_one_script(baseline_db):
    leave_in_progress(baseline_db)
    result = run_cli("migrate", "apply", "--sql", "--dsn", baseline_db.conninfo)
    assert result.code == ExitCode.CONFLICT
    assert "cannot be printed as one script" in result.stderr and result.stdout == ""
    assert conninfo_to_dict(baseline_db.conninfo)["dbname"] in result.stderr or "--dsn" in result.stderr


def test_the_conversion_of_an_earlier_builds_ledger_is_printed_for_review_only(harness, request):
    """It starts with a catalog comparison only the tool makes: the text is commented out and says so."""
    from tests.support import old_levels
    from tests.support.fingerprint import fingerprint

    template = harness.template("old_level_16", lambda conninfo: old_levels.build_level(conninfo, 16))
    for database in harness.fresh(template, request):
        before = fingerprint(database.conninfo)
        result = run_cli("migrate", "apply", "--sql", "--dsn", database.conninfo)
        assert result.code == ExitCode.OK, result.output
        assert result.stdout.startswith("-- FOR REVIEW ONLY (not runnable as is)")
        assert all(line.startswith("--") for line in result.stdout.splitlines())
        assert "CREATE OR REPLACE FUNCTION pgflow.claim_tasks(" in result.stdout
        note = " ".join(result.stderr.split())
        assert "cannot be printed as a script psql runs as is" in note and "compares the catalog" in note
        assert fingerprint(database.conninfo).differences(before) == []

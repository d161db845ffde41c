"""`pgflow migrate status / plan / apply` on databases installed by pgflow itself (the real command)."""

from __future__ import annotations

import contextlib
import signal

import psycopg

from pgflow_cli.errors import ExitCode
from tests.support.cli import kill_cli_when, run_cli
from tests.support.fingerprint import fingerprint
from tests.support.levels import versions_after
from tests.support.upstream_shapes import load_finished_runs

RECOGNISED = "installed by pgflow 0.8.0/0.8.1/0.9.0/0.9.1 (recognised from the catalog)"


def _modify(database) -> None:
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        conn.execute("ALTER TABLE pgflow.workers ADD COLUMN region text")


def test_status_and_plan_name_the_release_and_the_path(release_db):
    status = run_cli("migrate", "status", "--dsn", release_db.conninfo)
    plan = run_cli("migrate", "plan", "--dsn", release_db.conninfo)

    assert status.code == ExitCode.OK, status.output
    assert f"pgflow schema: {RECOGNISED}" in status.stdout
    assert plan.code == ExitCode.OK, plan.output
    lines = plan.stdout.splitlines()
    adopt = next(i for i, line in enumerate(lines) if line.startswith("step: adopt pgflow 0.8.0/0.8.1/0.9.0/0.9.1"))
    upgrade = next(i for i, line in enumerate(lines) if line.startswith("0003_queue_stage"))
    assert adopt < upgrade  # adopt release X -> baseline -> queue identity
    assert not any(line.startswith(("0001_", "0002_")) for line in lines)  # the adoption reaches the baseline
    assert "must: stop every worker" in plan.stdout
    json_plan = run_cli("migrate", "plan", "--dsn", release_db.conninfo, "--format", "json")
    assert '"status": "upstream"' in json_plan.stdout


def test_an_unrecognised_schema_is_refused_with_its_differences_and_nothing_changes(release_db):
    _modify(release_db)
    before = fingerprint(release_db.conninfo)

    plan = run_cli("migrate", "plan", "--dsn", release_db.conninfo)
    apply = run_cli("migrate", "apply", "--dsn", release_db.conninfo)

    for result in (plan, apply):
        assert result.code == ExitCode.CONFLICT, result.output
        assert "matches no published release" in result.stderr
        assert "extra column workers.region (text)" in result.output
        assert "--assume-release 0.9.1" in result.stderr
        assert "Traceback" not in result.output
    assert fingerprint(release_db.conninfo) == before


def test_an_asserted_release_is_adopted_and_recorded(release_db):
    _modify(release_db)

    result = run_cli("migrate", "apply", "--assume-release", "0.8.1", "--dsn", release_db.conninfo)

    assert result.code == ExitCode.OK, result.output
    assert "applied adoption of pgflow 0.8.1" in result.stderr and "applied 0003_queue_stage" in result.stderr
    status = run_cli("migrate", "status", "--dsn", release_db.conninfo)
    assert "adopted from pgflow 0.8.1 (asserted by the operator) by postgres" in status.stdout
    unknown = run_cli("migrate", "apply", "--assume-release", "0.7.3", "--dsn", release_db.conninfo)
    assert unknown.code == ExitCode.USAGE and "0.7.3" in unknown.stderr


def test_dry_run_and_sql_of_the_adoption_change_nothing(inflight_db):
    database, _state = inflight_db
    before = fingerprint(database.conninfo)

    dry = run_cli("migrate", "apply", "--dry-run", "--full", "--dsn", database.conninfo)  # --full: every lock
    script = run_cli("migrate", "apply", "--sql", "--dsn", database.conninfo)

    assert dry.code == ExitCode.OK, dry.output
    assert "rolled back (dry run) adoption of pgflow 0.8.0/0.8.1/0.9.0/0.9.1" in dry.stderr
    assert "pgflow.step_states: +0 ~" in dry.stdout  # the backfill, measured then rolled back
    assert "lock pgflow.step_tasks: AccessExclusiveLock" in dry.stdout
    assert "pg_temp" not in dry.stdout
    assert "0003_queue_stage" not in dry.stderr  # it needs the adoption committed
    assert script.code == ExitCode.OK, script.output
    # the adoption cannot be run by psql as is (the driver adds backfills and ledger rows): it is
    # printed for review, every line commented out, and stderr says so (issue 16 item 4)
    out = script.stdout
    assert out.startswith("-- FOR REVIEW ONLY (not runnable as is): adopt pgflow")
    assert all(line.startswith("--") for line in out.splitlines())
    assert "-- -- ==== adoption/schema.sql" in out and "-- CREATE FUNCTION pgflow.start_tasks(" in out
    assert "0003_queue_stage" not in out and "cannot be printed as a script psql runs as is" in script.stderr
    assert fingerprint(database.conninfo) == before


def test_status_after_adoption_shows_the_release_and_the_remaining_path(release_db):
    result = run_cli("migrate", "apply", "--target", "2", "--dsn", release_db.conninfo)
    assert result.code == ExitCode.OK, result.output

    status = run_cli("migrate", "status", "--dsn", release_db.conninfo)

    assert "pgflow schema: adopted from pgflow 0.8.0/0.8.1/0.9.0/0.9.1 by postgres" in status.stdout
    later = versions_after(3)
    assert (f"{1 + len(later)} pending ({', '.join(f'{v:04d}' for v in [3, *later])}); next: pgflow migrate plan"
            in " ".join(status.stdout.split()))
    audit = run_cli("audit", "--dsn", release_db.conninfo)
    assert "adopted from pgflow 0.8.0/0.8.1/0.9.0/0.9.1" in audit.stdout


def _backend_running(conn, needle: str) -> bool:
    rows = conn.execute("SELECT query FROM pg_stat_activity WHERE datname = current_database() "
                        "AND pid <> pg_backend_pid() AND state = 'active'").fetchall()
    return any(needle in (q or "") for (q,) in rows)


def test_a_killed_client_leaves_the_database_as_before_and_a_rerun_succeeds(release_db):
    load_finished_runs(release_db.conninfo, 5000)  # 50,000 completed steps: the backfill takes a while
    before = fingerprint(release_db.conninfo)
    # every DDL of the adoption has run in its transaction once the backfill statement is active
    killed = kill_cli_when(release_db.conninfo, "migrate", "apply", "--online", "never", "--dsn", release_db.conninfo,
                           ready=lambda watcher: _backend_running(watcher, "WITH target AS"),
                           what="the adoption's backfill")
    assert killed.code == -signal.SIGKILL

    assert fingerprint(release_db.conninfo) == before  # rolled back: the release, every row as it was

    rerun = run_cli("migrate", "apply", "--online", "never", "--dsn", release_db.conninfo, timeout=300)
    assert rerun.code == ExitCode.OK, rerun.output
    with psycopg.connect(release_db.conninfo) as conn:
        assert conn.execute("SELECT count(*) FROM pgflow.step_states WHERE output IS NULL").fetchone()[0] == 0
        assert conn.execute("SELECT pgflow.protocol_version()").fetchone()[0] == 2


def test_an_interrupted_online_completion_is_finished_by_the_next_apply(inflight_db):
    from pgflow_cli.upstream import adopt as adoption
    from pgflow_cli.upstream import recognise as rec

    database, state = inflight_db

    class Stop(Exception):
        pass

    def stop_at_index(event: str, data: dict) -> None:
        if event == "phase" and data["phase"] == "index":
            raise Stop()

    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        with contextlib.suppress(Stop):
            adoption.adopt(conn, rec.recognise(conn), online="always", progress=stop_at_index)
        left = adoption.pending_completion(conn)
    assert [step["step"] for step in left][:1] == ["index"] and left[-1] == {"step": "backfill", "next_page": 0}
    assert {step["step"] for step in left[1:-1]} == {"validate"}

    plan = run_cli("migrate", "plan", "--dsn", database.conninfo)
    assert "step: finish the adoption online (index, validate constraints)" in plan.stdout, plan.output
    assert "the history backfill has not stored the step outputs of runs that finished before the adoption (page 0 of " \
        in " ".join(plan.stdout.split()), plan.output
    result = run_cli("migrate", "apply", "--fill-history", "--dsn", database.conninfo)

    assert result.code == ExitCode.OK, result.output
    assert "phase index (online)" in result.stderr and "applied 0003_queue_stage" in result.stderr
    # the history backfill (asked for) runs last, after the migrations committed
    assert result.stderr.index("applied 0003_queue_stage") < result.stderr.index("phase backfill (online")
    assert "history backfill (adoption, online)" in result.stdout
    with psycopg.connect(database.conninfo) as conn:
        assert adoption.pending_completion(conn) == []
        assert conn.execute("SELECT count(*) FROM pg_constraint WHERE NOT convalidated "
                            "AND connamespace = 'pgflow'::regnamespace").fetchone()[0] == 0
        assert conn.execute("SELECT output FROM pgflow.step_states WHERE run_id = %s AND step_slug = 'ship'",
                            (state.runs["completed"],)).fetchone()[0] == {"parcel": "p1"}

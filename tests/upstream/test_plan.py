"""What `migrate plan` says about a database pgflow installed: the path and what the operator must do."""

from __future__ import annotations

import psycopg
import pytest

from pgflow_cli.errors import StateConflict, UsageError
from pgflow_cli.operations import upstream


def _inspect(database, **kwargs) -> upstream.UpstreamPlan:
    with psycopg.connect(database.conninfo) as conn:
        return upstream.inspect(conn, **kwargs)


def test_the_plan_of_the_published_release(release_db):
    plan = _inspect(release_db)

    assert plan.adoption_pending
    assert plan.steps == ["adopt pgflow 0.8.0/0.8.1/0.9.0/0.9.1 -> pgflow-cli baseline (0001, 0002 recorded), "
                          "in one transaction"]
    must = " ".join(plan.must_do)
    assert "stop every worker of pgflow 0.8.0/0.8.1/0.9.0/0.9.1" in must
    assert "input.run" in must  # before 0.12
    assert "no pg_cron job requeues stalled tasks" in must
    assert any("backfills every completed step" in note for note in plan.notes)
    assert upstream.refusal(plan) is None


def test_the_plan_names_cron_jobs_and_the_supabase_history(shape_db):
    database = shape_db("0.14.1")
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA cron; CREATE TABLE cron.job (jobid bigint PRIMARY KEY, schedule text, "
                     "command text, active boolean, jobname text)")
        conn.execute("INSERT INTO cron.job VALUES (1, '15 seconds', 'select pgflow.requeue_stalled_tasks()', true, "
                     "'pgflow_requeue_stalled_tasks'), (2, '1 second', 'select pgflow.poll_old_queue()', true, 'old')")
        conn.execute("CREATE SCHEMA supabase_migrations; CREATE TABLE supabase_migrations.schema_migrations "
                     "(version text PRIMARY KEY, statements text[], name text)")
        conn.execute("INSERT INTO supabase_migrations.schema_migrations VALUES "
                     "('20260301000000', NULL, '20260214181656_pgflow_step_conditions')")
        conn.execute("INSERT INTO pgflow.worker_functions (function_name, enabled) VALUES ('paused-worker', false), "
                     "('live-worker', true)")

    plan = _inspect(database)

    assert plan.steps[0].startswith("adopt pgflow 0.14.0/0.14.1 ->")
    assert not any("input.run" in m for m in plan.must_do)
    assert not any("no pg_cron job requeues" in m for m in plan.must_do)
    assert any("pgflow_requeue_stalled_tasks" in n and "keeps working" in n for n in plan.notes)
    assert any("cron.unschedule(2)" in m for m in plan.must_do)
    assert any("supabase_migrations.schema_migrations lists 1 pgflow migration(s) (pgflow 0.14.0/0.14.1)" in m
               for m in plan.must_do)
    assert any("1 worker function(s) have enabled = false (paused-worker)" in m for m in plan.must_do)


def test_an_unrecognised_schema_is_refused_unless_a_release_is_asserted(release_db):
    with psycopg.connect(release_db.conninfo, autocommit=True) as conn:
        conn.execute("ALTER TABLE pgflow.runs ADD COLUMN tenant text")

    plan = _inspect(release_db)
    refused = upstream.refusal(plan)
    asserted = _inspect(release_db, assume_release="0.8.1")

    assert not plan.adoption_pending and plan.steps == []
    assert isinstance(refused, StateConflict) and refused.detail == ["extra column runs.tenant (text)"]
    assert asserted.adoption_pending and upstream.refusal(asserted) is None
    assert asserted.steps[0].startswith("adopt pgflow 0.8.1 (asserted by the operator) ->")
    with pytest.raises(UsageError):
        _inspect(release_db, assume_release="1.0.0")


def test_nothing_to_adopt_on_our_own_database(baseline_db):
    plan = _inspect(baseline_db)
    assert not plan.adoption_pending and plan.steps == [] and plan.must_do == []

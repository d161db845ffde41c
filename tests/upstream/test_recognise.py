"""Recognition: which pgflow release installed a database, from catalog facts alone (read-only)."""

from __future__ import annotations

import psycopg
import pytest

from pgflow_cli.upstream import recognise as rec
from pgflow_cli.upstream import releases
from tests.support.fingerprint import fingerprint


def _recognise(database, **kwargs) -> rec.Recognition:
    with psycopg.connect(database.conninfo) as conn:
        return rec.recognise(conn, **kwargs)


def test_the_published_release_is_recognised_exactly(release_db):
    found = _recognise(release_db)

    assert found.status == rec.UPSTREAM and found.recognised
    assert found.releases == ("0.8.0", "0.8.1", "0.9.0", "0.9.1")
    assert found.differences == () and found.body_differences == ()  # every md5 of §2.5 matches too
    assert found.summary() == "installed by pgflow 0.8.0/0.8.1/0.9.0/0.9.1 (recognised from the catalog)"
    assert found.cron_jobs == () and found.supabase is None


def test_the_fingerprint_data_is_the_published_catalog(release_db):
    """The 0.8.x data equals the real build object for object (not only 'nearest')."""
    with psycopg.connect(release_db.conninfo) as conn:
        facts = rec.read_facts(conn)
    expected = releases.shape(0)
    for kind in releases.KINDS:
        assert facts.objects[kind] == dict(expected[kind]), kind


@pytest.mark.parametrize("release, members", [
    ("0.8.1", ("0.8.0", "0.8.1", "0.9.0", "0.9.1")),
    ("0.10.0", ("0.10.0",)),
    ("0.12.0", ("0.12.0",)),
    ("0.13.1", ("0.13.0", "0.13.1")),
    ("0.13.2", ("0.13.2", "0.13.3")),  # the stubs' bodies cannot tell 0.13.3's ensure_workers apart
    ("0.14.1", ("0.14.0", "0.14.1")),
])
def test_hand_written_shapes_are_recognised(shape_db, release, members):
    found = _recognise(shape_db(release))

    assert found.status == rec.UPSTREAM, [d.describe() for d in found.differences]
    assert found.releases == members
    assert found.differences == ()
    assert found.body_differences  # stub bodies are not the release's, which is only a note
    assert any("differ from the release" in note for note in found.notes)


def test_a_hand_modified_schema_is_unrecognised_with_its_exact_differences(release_db):
    with psycopg.connect(release_db.conninfo, autocommit=True) as conn:
        conn.execute("ALTER TABLE pgflow.runs DROP COLUMN failed_at CASCADE")
        conn.execute("ALTER TABLE pgflow.steps ADD COLUMN owner_team text DEFAULT 'core'")
        conn.execute("ALTER TABLE pgflow.step_tasks ALTER COLUMN attempts_count SET DEFAULT 1")
        conn.execute("ALTER TABLE pgflow.flows DROP CONSTRAINT opt_timeout_is_positive")
        conn.execute("CREATE FUNCTION pgflow.daily_report(day date) RETURNS jsonb LANGUAGE sql AS 'SELECT NULL::jsonb'")
        conn.execute("DROP FUNCTION pgflow.poll_for_tasks(text, int, int, int, int)")

    found = _recognise(release_db)

    assert found.status == rec.UNRECOGNISED and not found.recognised and not found.adoptable
    assert found.releases == ("0.8.0", "0.8.1", "0.9.0", "0.9.1")  # the nearest release
    described = {d.describe() for d in found.differences}
    assert described == {
        "missing column runs.failed_at (timestamp with time zone)",
        "extra column steps.owner_team (text default 'core'::text)",
        "changed column step_tasks.attempts_count: release has 'integer not null default 0', "
        "database has 'integer not null default 1'",
        "missing constraint flows.opt_timeout_is_positive (c)",
        "missing constraint runs.completed_at_or_failed_at (c)",  # went with the column (CASCADE)
        "missing constraint runs.failed_at_is_after_started_at (c)",
        "extra function daily_report(day date) (jsonb)",
        "missing function poll_for_tasks(queue_name text, vt integer, qty integer, max_poll_seconds integer, "
        "poll_interval_ms integer) (SETOF pgflow.step_task_record)",
    }
    assert "unrecognised pgflow schema: 8 difference(s) from the nearest release" in found.summary()


def test_the_prune_function_from_the_docs_is_optional(release_db):
    with psycopg.connect(release_db.conninfo, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION pgflow.prune_data_older_than(retention_interval interval) RETURNS void "
                     "LANGUAGE sql AS 'SELECT'")

    found = _recognise(release_db)

    assert found.status == rec.UPSTREAM and found.differences == ()
    assert found.optional == ("prune_data_older_than",)
    assert any("optional prune_data_older_than" in note for note in found.notes)


def test_an_asserted_release_is_compared_with_that_release(shape_db):
    database = shape_db("0.12.0")
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        conn.execute("ALTER TABLE pgflow.workers ADD COLUMN region text")

    plain = _recognise(database)
    asserted = _recognise(database, assume_release="0.12.0")

    assert plain.status == rec.UNRECOGNISED and not plain.adoptable
    assert asserted.assumed and asserted.adoptable and asserted.release == "0.12.0"
    assert [d.describe() for d in asserted.differences] == ["extra column workers.region (text)"]
    with pytest.raises(KeyError):
        _recognise(database, assume_release="0.7.3")


def test_no_pgflow_and_our_own_installs(empty_db, baseline_db, db):
    assert _recognise(empty_db).status == rec.NONE
    assert _recognise(baseline_db).status == rec.PGFLOW_CLI
    assert _recognise(db).status == rec.PGFLOW_CLI
    with psycopg.connect(baseline_db.conninfo, autocommit=True) as conn:
        conn.execute("DROP TABLE pgflow.schema_migrations")
    lost = _recognise(baseline_db)
    assert lost.status == rec.PGFLOW_CLI and "ledger is missing" in lost.notes[0]


def test_cron_jobs_and_the_supabase_history_are_read_and_judged(shape_db):
    database = shape_db("0.13.2")
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        # stand-ins with the columns pg_cron and the Supabase CLI have (neither is installed here)
        conn.execute("CREATE SCHEMA cron; CREATE TABLE cron.job (jobid bigint PRIMARY KEY, schedule text, "
                     "command text, nodename text, nodeport int, database text, username text, active boolean, "
                     "jobname text)")
        conn.execute("""INSERT INTO cron.job (jobid, schedule, command, active, jobname) VALUES
            (1, '1 second', 'select pgflow.ensure_workers()', true, 'pgflow_ensure_workers'),
            (2, '0 * * * *', 'select pgflow.cleanup_ensure_workers_logs()', true, 'pgflow_cleanup_logs'),
            (3, '15 seconds', 'select pgflow.requeue_stalled_tasks()', true, 'pgflow_requeue_stalled_tasks'),
            (4, '0 2 * * 0', 'select pgflow.prune_data_older_than(make_interval(days => 90))', true,
             'pgflow-prune-weekly'),
            (5, '* * * * *', 'select 1', true, 'unrelated')""")
        conn.execute("CREATE SCHEMA supabase_migrations; CREATE TABLE supabase_migrations.schema_migrations "
                     "(version text PRIMARY KEY, statements text[], name text)")
        conn.execute("""INSERT INTO supabase_migrations.schema_migrations (version, name) VALUES
            ('20260101000001', '20250429164909_pgflow_initial'),
            ('20260101000002', '20260103145141_pgflow_step_output_storage'),
            ('20260101000003', '20260120205547_pgflow_requeue_stalled_tasks'),
            ('20260101000004', 'create_app_tables')""")
    before = fingerprint(database.conninfo)

    found = _recognise(database)

    assert found.status == rec.UPSTREAM
    jobs = {j.jobname: j for j in found.cron_jobs}
    assert set(jobs) == {"pgflow_ensure_workers", "pgflow_cleanup_logs", "pgflow_requeue_stalled_tasks",
                         "pgflow-prune-weekly"}
    assert all(jobs[name].keeps_working for name in ("pgflow_ensure_workers", "pgflow_cleanup_logs",
                                                     "pgflow_requeue_stalled_tasks"))
    prune = jobs["pgflow-prune-weekly"]
    assert prune.missing == ("prune_data_older_than",) and "cron.unschedule(4)" in prune.verdict()
    assert found.supabase is not None
    assert [name for _, name in found.supabase.rows] == [
        "20250429164909_pgflow_initial", "20260103145141_pgflow_step_output_storage",
        "20260120205547_pgflow_requeue_stalled_tasks"]
    assert found.supabase.releases == ("0.13.2",)
    assert fingerprint(database.conninfo) == before  # read-only


def test_recognition_is_read_only_and_small(release_db):
    with psycopg.connect(release_db.conninfo) as conn:
        conn.execute("SET TRANSACTION READ ONLY")
        statements = []
        conn.add_notice_handler(lambda d: None)
        original = conn.execute

        def counting(query, params=None, **kwargs):
            statements.append(query)
            return original(query, params, **kwargs)

        conn.execute = counting  # type: ignore[method-assign]
        found = rec.recognise(conn)
        assert found.recognised
        assert len(statements) == 1  # no cron, no Supabase history here: the one catalog query

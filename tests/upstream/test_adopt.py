"""Adoption: a schema installed by a published pgflow release becomes pgflow-cli's baseline in place."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql

from pgflow_cli import installer
from pgflow_cli.errors import StateConflict
from pgflow_cli.installer.events import PhaseStarted
from pgflow_cli.upstream import adopt as adoption
from pgflow_cli.upstream import recognise as rec
from tests.support.fingerprint import fingerprint
from tests.support.levels import versions_after
from tests.upstream.conftest import catalog

ADOPTED_COMMENT = "pgflow workflow engine (installed by pgflow, adopted by pgflow-cli"


def _adopt(database, **kwargs) -> adoption.Adopted:
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        found = rec.recognise(conn, assume_release=kwargs.pop("assume_release", None))
        return adoption.adopt(conn, found, **kwargs)


def _baseline_catalog(baseline_db) -> set[str]:
    return catalog(baseline_db.conninfo)


def _counts(conn) -> dict[str, int]:
    tables = ("flows", "steps", "deps", "runs", "step_states", "step_tasks", "workers")
    return {t: conn.execute(sql.SQL("SELECT count(*) FROM pgflow.{}").format(sql.Identifier(t))).fetchone()[0]
            for t in tables}


def test_the_published_release_becomes_the_baseline(release_db, baseline_db):
    adopted = _adopt(release_db)

    assert adopted.releases == ("0.8.0", "0.8.1", "0.9.0", "0.9.1") and not adopted.assumed
    assert catalog(release_db.conninfo) == _baseline_catalog(baseline_db)
    with psycopg.connect(release_db.conninfo) as conn:
        comment = conn.execute("SELECT obj_description('pgflow'::regnamespace, 'pg_namespace')").fetchone()[0]
        assert comment.startswith(ADOPTED_COMMENT)
        plan = installer.make_plan(conn)
        expected = [(1, "applied"), (2, "applied")] + [(v, "pending") for v in (3, *versions_after(3))]
        assert [(s.version, s.state) for s in plan.statuses] == expected
        assert plan.refuse_reasons() is None
        found = rec.recognise(conn)
        assert found.status == rec.ADOPTED
        assert found.summary() == "adopted from pgflow 0.8.0/0.8.1/0.9.0/0.9.1 by postgres"
        record = found.adoption
        assert record["release"] == "0.9.1" and record["differences"] == [] and record["assumed"] is False
        assert len(record["checksum"]) == 64


@pytest.mark.parametrize("release", ["0.10.0", "0.12.0", "0.13.1", "0.13.2", "0.14.1"])
def test_every_later_shape_becomes_the_baseline(shape_db, baseline_db, release):
    database = shape_db(release)

    _adopt(database)

    assert catalog(database.conninfo) == _baseline_catalog(baseline_db)


def test_every_row_is_kept_and_step_outputs_are_backfilled(inflight_db):
    database, state = inflight_db
    conn = database.connect()
    before = _counts(conn)
    tasks_before = conn.execute("SELECT run_id, step_slug, task_index, status, attempts_count, message_id, output "
                                "FROM pgflow.step_tasks ORDER BY 1, 2, 3").fetchall()

    _adopt(database)

    assert _counts(conn) == before
    assert conn.execute("SELECT run_id, step_slug, task_index, status, attempts_count, message_id, output "
                        "FROM pgflow.step_tasks ORDER BY 1, 2, 3").fetchall() == tasks_before
    outputs = dict(conn.execute("SELECT run_id::text || '/' || step_slug, output FROM pgflow.step_states "
                                "WHERE status = 'completed'").fetchall())
    runs = state.runs
    assert outputs == {
        f"{runs['completed']}/validate": {"ok": True}, f"{runs['completed']}/charge": {"charged": 10},
        f"{runs['completed']}/ship": {"parcel": "p1"},
        f"{runs['retry_pending']}/validate": {"ok": True},
        f"{runs['map_half_done']}/list": [1, 2, 3, 4],
    }
    assert conn.execute("SELECT count(*) FROM pgflow.step_states WHERE status <> 'completed' AND output IS NOT NULL"
                        ).fetchone()[0] == 0
    # new columns took their defaults on every existing row
    assert conn.execute("SELECT DISTINCT when_unmet, when_exhausted FROM pgflow.steps").fetchall() == [("skip", "fail")]
    assert conn.execute("SELECT DISTINCT requeued_count FROM pgflow.step_tasks").fetchall() == [(0,)]


def test_a_map_without_completed_tasks_gets_an_empty_array(release_db):
    with psycopg.connect(release_db.conninfo, autocommit=True) as conn:
        conn.execute("SELECT pgflow.create_flow('rootMap')")
        conn.execute("SELECT pgflow.add_step('rootMap', 'items', step_type => 'map')")
        run = conn.execute("SELECT run_id FROM pgflow.start_flow('rootMap', '[]'::jsonb)").fetchone()[0]
        assert conn.execute("SELECT status FROM pgflow.step_states WHERE run_id = %s", (run,)).fetchone()[0] == \
            "completed"

    _adopt(release_db)

    with psycopg.connect(release_db.conninfo) as conn:
        assert conn.execute("SELECT output FROM pgflow.step_states WHERE run_id = %s", (run,)).fetchone()[0] == []


def test_grants_to_roles_are_kept_and_nothing_new_is_granted(release_db):
    role, other = f"app_{uuid.uuid4().hex[:8]}", f"auto_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(release_db.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN; CREATE ROLE {} NOLOGIN").format(
            sql.Identifier(role), sql.Identifier(other)))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA pgflow TO {r}; GRANT SELECT ON pgflow.runs TO {r}; "
                             "GRANT EXECUTE ON FUNCTION pgflow.start_flow(text, jsonb, uuid) TO {r}; "
                             "GRANT EXECUTE ON FUNCTION pgflow.add_step(text, text, text[], int, int, int, int, "
                             "text) TO {r}").format(r=sql.Identifier(role)))
        # a standing rule that would hand every new object to another role
        conn.execute(sql.SQL("ALTER DEFAULT PRIVILEGES IN SCHEMA pgflow GRANT EXECUTE ON FUNCTIONS TO {o}; "
                             "ALTER DEFAULT PRIVILEGES IN SCHEMA pgflow GRANT ALL ON TABLES TO {o}").format(
            o=sql.Identifier(other)))

    _adopt(release_db)

    with psycopg.connect(release_db.conninfo) as conn:
        def can(who: str, check: str, obj: str) -> bool:
            return conn.execute(f"SELECT {check}(%s, %s, 'EXECUTE')" if check == "has_function_privilege"
                                else f"SELECT {check}(%s, %s, 'SELECT')", (who, obj)).fetchone()[0]

        assert conn.execute("SELECT has_schema_privilege(%s, 'pgflow', 'USAGE')", (role,)).fetchone()[0]
        assert can(role, "has_table_privilege", "pgflow.runs")
        assert can(role, "has_function_privilege", "pgflow.start_flow(text, jsonb, uuid)")
        # add_step changed its signature: the grant follows the function pgflow-cli replaced it by
        assert can(role, "has_function_privilege",
                   "pgflow.add_step(text, text, text[], int, int, int, int, text, jsonb, jsonb, text, text)")
        assert not can(role, "has_function_privilege", "pgflow.start_tasks(text, bigint[], uuid)")
        assert not can(role, "has_function_privilege", "pgflow.protocol_version()")
        granted = conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p, aclexplode(p.proacl) a "
            "WHERE p.pronamespace = 'pgflow'::regnamespace AND a.grantee = %s::regrole", (other,)).fetchall()
        assert granted == []
        assert not can(other, "has_table_privilege", "pgflow.worker_functions")
        assert not conn.execute("SELECT has_schema_privilege('public', 'pgflow', 'USAGE')").fetchone()[0]


def test_the_optional_prune_function_is_replaced_with_its_grants(release_db):
    role = f"janitor_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(release_db.conninfo, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION pgflow.prune_data_older_than(retention_interval interval) RETURNS void "
                     "LANGUAGE sql AS 'SELECT'")
        conn.execute(sql.SQL("CREATE ROLE {r} NOLOGIN; GRANT EXECUTE ON FUNCTION "
                             "pgflow.prune_data_older_than(interval) TO {r}").format(r=sql.Identifier(role)))

    _adopt(release_db)

    with psycopg.connect(release_db.conninfo) as conn:
        assert conn.execute("SELECT pg_get_function_result('pgflow.prune_data_older_than(interval)'::regprocedure)"
                            ).fetchone()[0] == "jsonb"
        assert conn.execute("SELECT has_function_privilege(%s, 'pgflow.prune_data_older_than(interval)', 'EXECUTE')",
                            (role,)).fetchone()[0]


def test_dry_run_changes_nothing(release_db):
    before = fingerprint(release_db.conninfo)
    seen = []

    adopted = _adopt(release_db, dry_run=True,
                     before_commit=lambda c: seen.append(c.execute("SELECT pgflow.protocol_version()").fetchone()[0]))

    assert adopted.dry_run and seen == [1]  # the adopted runtime was there inside the transaction
    assert fingerprint(release_db.conninfo) == before


def test_an_unrecognised_schema_is_refused_and_left_alone(release_db):
    with psycopg.connect(release_db.conninfo, autocommit=True) as conn:
        conn.execute("ALTER TABLE pgflow.workers ADD COLUMN region text")
    before = fingerprint(release_db.conninfo)

    with pytest.raises(StateConflict) as refused:
        _adopt(release_db)

    assert "matches no published release" in refused.value.message
    assert refused.value.detail == ["extra column workers.region (text)"]
    assert "--assume-release 0.9.1" in refused.value.hint
    assert fingerprint(release_db.conninfo) == before


def test_an_asserted_release_is_adopted_and_recorded(release_db):
    with psycopg.connect(release_db.conninfo, autocommit=True) as conn:
        conn.execute("ALTER TABLE pgflow.workers ADD COLUMN region text")

    adopted = _adopt(release_db, assume_release="0.8.1")

    assert adopted.assumed and adopted.release == "0.8.1"
    with psycopg.connect(release_db.conninfo) as conn:
        found = rec.recognise(conn)
        assert found.summary() == "adopted from pgflow 0.8.1 (asserted by the operator) by postgres"
        assert found.adoption["differences"] == [
            {"change": "extra", "kind": "column", "name": "workers.region", "expected": None, "found": "text"}]
        # the operator's extra column is kept
        assert conn.execute("SELECT count(*) FROM pg_attribute WHERE attrelid = 'pgflow.workers'::regclass "
                            "AND attname = 'region'").fetchone()[0] == 1


def test_the_supabase_history_is_left_alone(release_db):
    with psycopg.connect(release_db.conninfo, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA supabase_migrations; CREATE TABLE supabase_migrations.schema_migrations "
                     "(version text PRIMARY KEY, statements text[], name text)")
        conn.execute("INSERT INTO supabase_migrations.schema_migrations VALUES "
                     "('20260101000001', ARRAY['select 1'], '20251104080523_pgflow_upgrade_pgmq_1_5_1')")
        before = conn.execute("SELECT * FROM supabase_migrations.schema_migrations").fetchall()

    adopted = _adopt(release_db)

    with psycopg.connect(release_db.conninfo) as conn:
        assert conn.execute("SELECT * FROM supabase_migrations.schema_migrations").fetchall() == before
        record = rec.recognise(conn).adoption
        assert record["supabase_history"]["releases"] == list(adopted.releases)


def test_online_adoption_finishes_after_its_commit_and_reaches_the_same_catalog(inflight_db, baseline_db):
    database, state = inflight_db
    inside = {}

    def look(conn) -> None:
        rows = conn.execute("SELECT run_id, step_slug, output FROM pgflow.step_states WHERE status = 'completed'"
                            ).fetchall()
        inside.update({(str(r), s): o for r, s, o in rows})
        inside["unvalidated"] = conn.execute("SELECT count(*) FROM pg_constraint WHERE NOT convalidated "
                                             "AND connamespace = 'pgflow'::regnamespace").fetchone()[0]

    events = []
    adopted = _adopt(database, online="always", before_commit=look, progress=events.append)

    runs = {k: str(v) for k, v in state.runs.items()}
    # inside the transaction: only what the runtime will read (runs in flight) was backfilled
    assert inside[(runs["map_half_done"], "list")] == [1, 2, 3, 4]
    assert inside[(runs["retry_pending"], "validate")] == {"ok": True}
    assert inside[(runs["completed"], "ship")] is None
    assert inside["unvalidated"] >= 14  # the new rules of steps, step_states and step_tasks
    # after adopt(): the index and the validations are done, the catalog is a baseline install's;
    # the finished runs' outputs (history) are left for after the migrations
    assert adopted.online
    phases = [e.phase for e in events if isinstance(e, PhaseStarted)]
    assert phases[:1] == ["index"] and phases.count("validate") == inside["unvalidated"]
    assert adoption.HISTORY_STEP not in phases
    assert catalog(database.conninfo) == _baseline_catalog(baseline_db)
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        assert adoption.pending_completion(conn) == [{"step": adoption.HISTORY_STEP, "next_page": 0}]
        assert conn.execute("SELECT output FROM pgflow.step_states WHERE run_id = %s AND step_slug = 'ship'",
                            (state.runs["completed"],)).fetchone()[0] is None
        assert adoption.complete(conn, history=True) == 1
        assert conn.execute("SELECT output FROM pgflow.step_states WHERE run_id = %s AND step_slug = 'ship'",
                            (state.runs["completed"],)).fetchone()[0] == {"parcel": "p1"}
        assert adoption.pending_completion(conn) == []
        record = rec.recognise(conn).adoption
        assert record is not None

"""Fixtures of the upstream-adoption tests: databases installed by pgflow's own migrations.

* ``release_db``: the published @pgflow/core 0.8.1 migrations, nothing else (no flows);
* ``inflight_db``: the same with runs in every state, driven through the 0.8.1 functions
  (``(database, PreUpgrade)``);
* ``shape_db(release)``: a factory for the hand-written schema shapes of later releases
  (tests/support/upstream_shapes.py);
* ``catalog(conninfo)``: the catalog facts two databases must share after adoption.
"""

from __future__ import annotations

import psycopg
import pytest

from tests.support import published, upstream_shapes
from tests.support.server import label_of
from tests.upgrade.conftest import BaselineDriver, PreUpgrade, start_runs_in_every_state

OLD_WORKER = "00000000-0000-4000-8000-0000000000aa"

FLOWS_081 = """
SELECT pgflow.create_flow('orderFlow', base_delay => 30);
SELECT pgflow.add_step('orderFlow', 'validate', max_attempts => 1);
SELECT pgflow.add_step('orderFlow', 'charge', ARRAY['validate'], max_attempts => 3);
SELECT pgflow.add_step('orderFlow', 'ship', ARRAY['charge']);
SELECT pgflow.create_flow('fanOut');
SELECT pgflow.add_step('fanOut', 'list');
SELECT pgflow.add_step('fanOut', 'process', ARRAY['list'], step_type => 'map');
SELECT pgflow.add_step('fanOut', 'collect', ARRAY['process']);
"""
"""The upgrade fixture's orderFlow and fanOut, defined with the 0.8.1 functions (0.8.1 has no
conditional steps, so the fixture's third flow is left out)."""


@pytest.fixture(scope="session")
def release_template(harness) -> str:
    try:
        return harness.template("release_081", lambda c: published.build_schema(c, harness.admin))
    except published.PublishedReleaseError as exc:
        pytest.fail(f"cannot build the published-release database: {exc}", pytrace=False)


@pytest.fixture
def release_db(harness, release_template, request):
    yield from harness.fresh(release_template, request)


def build_inflight(conninfo: str) -> PreUpgrade:
    """Runs in every state on a 0.8.1 database, made only with the 0.8.1 functions."""
    state = PreUpgrade()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(FLOWS_081)
        conn.execute("INSERT INTO pgflow.workers (worker_id, queue_name, function_name) VALUES (%s, 'orderFlow', "
                     "'legacy-worker')", (str(state.old_worker),))
        d = BaselineDriver(conn, state.old_worker)

        start_runs_in_every_state(d, state)
    return state


@pytest.fixture
def inflight_db(harness, release_template, request):
    """``(database, PreUpgrade)``: 0.8.1 with runs in every state (built per test: ~0.2 s)."""
    for database in harness.fresh(release_template, request):
        yield database, build_inflight(database.conninfo)


@pytest.fixture
def shape_db(harness, request):
    """``shape_db(release)``: a fresh database holding the hand-written shape of ``release``."""
    made = []

    def make(release: str):
        template = harness.template(f"shape_{release.replace('.', '')}",
                                    lambda c: upstream_shapes.build(c, release))
        database = harness.clone(template, label_of(request))
        made.append(database)
        return database

    yield make
    for database in made:
        harness.drop(database)


CATALOG = """
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
       || COALESCE(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
       || COALESCE(' comment ' || col_description(c.oid, a.attnum), '')
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE c.relnamespace = 'pgflow'::regnamespace AND c.relkind IN ('r', 'c') AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'relation ' || c.relname || ' ' || c.relkind::text || ' ' || COALESCE(array_to_string(c.relacl, ','), '-')
       || ' ' || COALESCE(obj_description(c.oid, 'pg_class'), '')
FROM pg_class c WHERE c.relnamespace = 'pgflow'::regnamespace
UNION ALL
SELECT 'constraint ' || c.relname || '.' || co.conname || ' ' || pg_get_constraintdef(co.oid)
       || ' validated=' || co.convalidated::text
FROM pg_constraint co JOIN pg_class c ON c.oid = co.conrelid WHERE c.relnamespace = 'pgflow'::regnamespace
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid)
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relnamespace = 'pgflow'::regnamespace
UNION ALL
SELECT 'function ' || p.oid::regprocedure::text || ' -> ' || pg_get_function_result(p.oid)
       || ' acl=' || COALESCE(array_to_string(p.proacl, ','), '-') || ' body=' || md5(p.prosrc)
       || ' config=' || COALESCE(array_to_string(p.proconfig, ','), '-') || ' definer=' || p.prosecdef::text
       || ' volatility=' || p.provolatile::text || ' comment=' || COALESCE(obj_description(p.oid, 'pg_proc'), '')
FROM pg_proc p WHERE p.pronamespace = 'pgflow'::regnamespace
UNION ALL
SELECT 'schema acl=' || COALESCE(array_to_string(nspacl, ','), '-') FROM pg_namespace WHERE nspname = 'pgflow'
UNION ALL
SELECT 'default acl ' || defaclobjtype::text || ' ' || array_to_string(defaclacl, ',') FROM pg_default_acl
"""


def catalog(conninfo: str) -> set[str]:
    """Every catalog fact of schema pgflow that adoption must make equal to a baseline install
    (columns by name, not position; the ledger and the adoption record left out)."""
    with psycopg.connect(conninfo) as conn:
        rows = {r[0] for r in conn.execute(CATALOG).fetchall()}
    return {r for r in rows if "schema_adoption" not in r and "schema_migrations" not in r}

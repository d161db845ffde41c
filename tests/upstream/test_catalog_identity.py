"""Every way to reach the queue stage ends with one catalog: a fresh install, an upgrade from the
baseline, the adoption of the published 0.8.1 database and of every upstream shape the tests build
(then the migrations after the baseline), and (tests/upgrade/test_old_levels.py) an earlier build's
level 16 after its conversion. Compared: every function with its body, options, comment and ACL,
types, triggers, tables, columns, defaults, constraints, indexes, comments and privileges."""

from __future__ import annotations

import pytest

from pgflow_cli.errors import ExitCode
from tests.layout.catalog import differences, identity
from tests.support import upstream_shapes
from tests.support.cli import run_cli


def _fresh(db) -> dict[str, object]:
    with db.connect() as conn:
        return identity(conn)


def _applied(database) -> dict[str, object]:
    result = run_cli("migrate", "apply", "--dsn", database.conninfo)
    assert result.code == ExitCode.OK, result.output
    with database.connect() as conn:
        return identity(conn)


def test_an_upgrade_from_the_baseline_equals_a_fresh_install(baseline_db, db):
    assert differences(_applied(baseline_db), _fresh(db)) == []


def test_the_adopted_published_release_equals_a_fresh_install(release_db, db):
    assert differences(_applied(release_db), _fresh(db)) == []


@pytest.mark.parametrize("release", upstream_shapes.SHAPES)
def test_every_adopted_upstream_shape_equals_a_fresh_install(shape_db, db, release):
    assert differences(_applied(shape_db(release)), _fresh(db)) == []


def test_an_adopted_database_with_runs_in_every_state_equals_a_fresh_install(inflight_db, db):
    database, _state = inflight_db
    assert differences(_applied(database), _fresh(db)) == []

"""A fresh install and an upgrade from the baseline end with the same definitions, byte for byte."""

from __future__ import annotations

from pgflow_cli import installer
from tests.layout.catalog import definitions


def test_upgrade_from_baseline_defines_every_routine_as_a_fresh_install(db, baseline_db):
    with baseline_db.connect() as conn:
        assert installer.make_plan(conn).pending, "the baseline database must have pending migrations"
        installer.apply(conn)
        upgraded = definitions(conn)
    with db.connect() as conn:
        fresh = definitions(conn)
    assert len(fresh) >= 60  # every function, type and trigger of the runtime, not an empty schema
    assert sorted(fresh) == sorted(upgraded)
    different = [name for name in fresh if fresh[name] != upgraded[name]]
    assert different == []


def test_the_baseline_still_has_the_protocol_1_runtime(baseline_db):
    with baseline_db.connect() as conn:
        baseline = definitions(conn)
        assert conn.execute("SELECT pgflow.protocol_version()").fetchone()[0] == 1
    assert "function pgflow.start_tasks(text,bigint[],uuid)" in baseline
    assert "PF002" not in baseline["function pgflow.start_tasks(text,bigint[],uuid)"]
    assert not any(name.startswith("function pgflow.claim_tasks(") for name in baseline)

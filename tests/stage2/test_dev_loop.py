"""The development loop: in local mode (`pgflow.environment = 'local'`, what the sandbox runs in) a
worker whose flow changed recompiles it, and says loudly what that deletes before it does; in
production the worker is refused with a hint naming local mode and versioned slugs."""

from __future__ import annotations

import signal

from psycopg import sql

from tests.stage2.helpers import CliWorker, flow_target
from tests.support.cli import run_cli


def _older_definition(conn, runs: int) -> None:
    """Flow cliPlain as an earlier version of tests/stage2/flows_module.py defined it, with runs."""
    conn.execute("SELECT pgflow.create_flow('cliPlain')")
    conn.execute("SELECT pgflow.add_step('cliPlain', 'other')")
    for _ in range(runs):
        conn.execute("SELECT pgflow.start_flow('cliPlain', '{}'::jsonb)")


def _local(database) -> None:
    database.connect().execute(sql.SQL("ALTER DATABASE {} SET pgflow.environment = 'local'")
                               .format(sql.Identifier(database.name)))


def test_a_changed_flow_in_local_mode_is_recompiled_after_saying_what_goes(db):
    _local(db)
    conn = db.connect()
    _older_definition(conn, runs=2)
    proc = CliWorker.start(db.conninfo, flow_target("plain"))
    try:
        proc.wait_started()
        lines = proc.lines("stderr")
        warning = next(i for i, line in enumerate(lines) if "LOCAL MODE" in line)
        started = next(i for i, line in enumerate(lines) if " started: flow=" in line)
        assert warning < started  # said before the worker compiled (and deleted)
        text = " ".join(lines[warning:started])
        assert "flow 'cliPlain' changed" in text
        assert "DELETES its 2 run(s) (2 in flight) and 2 task(s) (2 queued or running)" in text
        assert conn.execute("SELECT count(*) FROM pgflow.runs WHERE flow_slug = 'cliPlain'").fetchone()[0] == 0
        steps = [r[0] for r in conn.execute("SELECT step_slug FROM pgflow.steps WHERE flow_slug = 'cliPlain' "
                                            "ORDER BY step_index").fetchall()]
        assert steps == ["first", "second"]
        proc.signal(signal.SIGTERM)
        assert proc.wait_exit() == 0
    finally:
        proc.kill()


def test_the_same_flow_in_local_mode_says_nothing(db):
    _local(db)
    first = CliWorker.start(db.conninfo, flow_target("plain"))
    try:
        first.wait_started()
        first.signal(signal.SIGTERM)
        assert first.wait_exit() == 0
    finally:
        first.kill()
    again = CliWorker.start(db.conninfo, flow_target("plain"))
    try:
        again.wait_started()
        assert not any("LOCAL MODE" in line for line in again.lines("stderr"))
        again.signal(signal.SIGTERM)
        assert again.wait_exit() == 0
    finally:
        again.kill()


def test_in_production_the_refusal_names_local_mode_and_versioned_slugs(db):
    conn = db.connect()
    _older_definition(conn, runs=1)
    result = run_cli("worker", flow_target("plain"), "--dsn", db.conninfo)
    assert result.code == 6, result.output
    assert "local mode" in result.stderr and "versioned flow slug" in result.stderr
    assert "pgflow sandbox up" in result.stderr and "LOCAL MODE" not in result.stderr
    assert conn.execute("SELECT count(*) FROM pgflow.runs").fetchone()[0] == 1  # nothing was deleted

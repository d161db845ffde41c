"""Shared set-ups of the output tests."""

from __future__ import annotations

import pytest

from pgflow_cli import installer
from pgflow_cli.installer import events


class _Stop(Exception):
    pass


def leave_in_progress(database) -> None:
    """Apply the pending migrations phase by phase and stop before 0003's last phase: 0003 is left
    in progress (committed phases prepare, backfill, validate, index)."""

    def stop(event: events.Event) -> None:
        if isinstance(event, events.PhaseStarted) and event.phase == "main":
            raise _Stop()

    with pytest.raises(_Stop):
        installer.apply(database.connect(), online="always", progress=stop)


def seed(database) -> None:
    """The state the examples of docs/commands/ run on (latest schema): flow ``review`` (a manual step
    ``approve``, then ``ship``), one run waiting on ``approve``, and worker function ``review-worker``."""
    import psycopg

    from pgflow_cli.worker import protocol
    from pgflow_cli.worker.flow import Flow
    from tests.runtime.driver import Runtime

    flow = Flow("review").step("approve", manual=True).step("ship", lambda i, c: i, depends_on=["approve"])
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        protocol.ProtocolV2().compile(conn, flow.slug, flow.shape(), None)
        conn.execute("INSERT INTO pgflow.worker_functions (function_name) VALUES ('review-worker')")
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        Runtime(conn, level="upgraded").start("review", {"secret": "never-printed"})


def seed_baseline(database, *, blocked: bool = False) -> None:
    """The pre-upgrade state of the examples: the baseline schema with flow ``orders``; ``blocked``
    adds flow ``_hidden``, a slug the upgrade rejects (a blocking finding)."""
    from tests.audit.helpers import define_flow

    conn = database.connect()
    define_flow(conn, "orders", ["validate", "ship"])
    if blocked:
        define_flow(conn, "_hidden", ["work"])


def fixed_database(harness, template: str, name: str):
    """A clone of ``template`` under the fixed name ``name`` (examples print the database name; a fixed
    name keeps their line wrapping the same from run to run). Dropped first if it exists."""
    from psycopg import sql

    from tests.support.server import TestDatabase

    harness.admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    harness.admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template)))
    return TestDatabase(name, harness.server)

"""Fixtures of the compatibility tests (issue 17, docs/compatibility.md).

Each test is named after one item of docs/compatibility.md "Known differences" and pins the
decided behaviour on the real server:

* ``old``: a :class:`tests.runtime.driver.Runtime` on ``baseline_db`` (0001-0002, protocol 1),
  the released-runtime baseline an upgrade starts from; where the queue stage changes an item,
  the test also pins that the baseline still behaves as before;
* ``new``: the same driver on ``db`` (every migration, protocol 2): the current behaviour;
* ``rt``: parametrized over both levels, for items that are the same on both.

The runtime invariants (tests/support/invariants.py) are checked after every test.
"""

from __future__ import annotations

import pytest

from tests.runtime.driver import checked_runtime

LEVELS = {"baseline": "baseline_db", "current": "db"}
"""Test id -> database fixture; ``current`` speaks protocol 2 (``Runtime`` level ``upgraded``)."""


@pytest.fixture
def old(baseline_db):
    """The released-runtime baseline (0001-0002)."""
    yield from checked_runtime(baseline_db, "baseline")


@pytest.fixture
def new(db):
    """Every migration: the behaviour docs/compatibility.md describes."""
    yield from checked_runtime(db, "upgraded")


@pytest.fixture(params=sorted(LEVELS))
def rt(request):
    """One runtime per schema level, for items whose behaviour both levels share."""
    database = request.getfixturevalue(LEVELS[request.param])
    yield from checked_runtime(database, "baseline" if request.param == "baseline" else "upgraded")


FAKE_REALTIME = """
CREATE SCHEMA realtime;
CREATE TABLE realtime.sent (id bigserial PRIMARY KEY, payload jsonb, event text, topic text);
CREATE FUNCTION realtime.send(payload jsonb, event text, topic text, private boolean DEFAULT true)
RETURNS void LANGUAGE sql AS
  $$ INSERT INTO realtime.sent (payload, event, topic) VALUES (payload, event, topic) $$;
"""
"""A stand-in for Supabase's realtime.send that records every broadcast (not installed on test servers)."""

FAKE_CRON_HISTORY = """
CREATE SCHEMA cron;
CREATE TABLE cron.job_run_details (runid bigserial PRIMARY KEY, end_time timestamptz);
"""
"""The one pg_cron table cleanup_ensure_workers_logs reads (pg_cron is not installed on test servers)."""

"""Fixtures of the runtime tests: every test runs on two schema levels, invariants after each.

* ``baseline``: PGMQ + migrations 0001-0002 (protocol 1, the released runtime an upgrade
  starts from);
* ``upgraded``: PGMQ + every migration (0003 queue identity, protocol 2).

The same test body runs on both, through :class:`tests.runtime.driver.Runtime`, which speaks
each level's worker protocol. So the suite proves the upgraded runtime keeps the baseline's
semantics. Tests that are about one level only carry a marker and are skipped on the other,
with the reason shown in the report:

* ``@pytest.mark.baseline_only(reason=...)``: behaviour 0003 removes on purpose (mixed-case
  aliases, adopting an existing queue, ``start_tasks`` itself, the 0002 helper contract);
* ``@pytest.mark.upgraded_only(reason=...)``: the protocol-2 counterpart of such a test.
"""

from __future__ import annotations

import psycopg
import pytest

from tests.runtime.driver import LEVELS, Runtime, install_all
from tests.support.invariants import assert_runtime_invariants


def pytest_configure(config):
    config.addinivalue_line("markers", "baseline_only(reason): runtime test that only applies to the released baseline (0001-0002)")
    config.addinivalue_line("markers", "upgraded_only(reason): runtime test of the queue-identity schema (0003) only")


@pytest.fixture(params=LEVELS)
def level(request) -> str:
    """The schema level of this test run; skips tests marked for the other level."""
    other = {"baseline": "upgraded_only", "upgraded": "baseline_only"}[request.param]
    marker = request.node.get_closest_marker(other)
    if marker is not None:
        reason = marker.kwargs.get("reason") or (marker.args[0] if marker.args else other)
        pytest.skip(f"{other.replace('_', '-')}: {reason}")
    return request.param


@pytest.fixture
def db(level, harness, request):
    """The database of this level: the pre-upgrade one, or one with every migration.

    The upgraded database is cloned from the same ``latest`` template as the top-level
    ``db`` fixture (built by the same installer call, whichever fixture asks first).
    """
    if level == "baseline":
        yield request.getfixturevalue("baseline_db")
        return
    yield from harness.fresh(harness.template("latest", install_all), request)


def _queue_identity_problems(conn: psycopg.Connection) -> list[str]:
    """Upgraded level: every task's snapshot is its step's route, lower(flow_slug) for plain flows."""
    rows = conn.execute(
        """
        SELECT t.run_id, t.step_slug, t.task_index, t.queue_name, s.queue_name AS route, t.flow_slug
        FROM pgflow.step_tasks t
        JOIN pgflow.steps s ON s.flow_slug = t.flow_slug AND s.step_slug = t.step_slug
        WHERE t.queue_name IS DISTINCT FROM s.queue_name
           OR t.queue_name IS DISTINCT FROM lower(t.flow_slug COLLATE "C")
        """
    ).fetchall()
    return [f"task {r[1]}[{r[2]}] of run {r[0]} has queue {r[3]!r}, its step routes to {r[4]!r} (flow {r[5]!r})" for r in rows]


@pytest.fixture
def rt(db, level):
    """A :class:`Runtime` speaking ``level``'s worker protocol on a fresh database.

    After the test body, the runtime invariants are checked on the same database
    (tests/support/invariants.py), on both levels; on the upgraded level also that every task
    snapshot equals its step's route. A test that breaks a rule on purpose must repair it or
    set ``rt.require_live_messages = False`` for the one rule it breaks.
    """
    runtime = Runtime(db.connect(), level=level)
    yield runtime
    check = db.connect()
    assert_runtime_invariants(check, require_live_messages=runtime.require_live_messages)
    if level == "upgraded":
        problems = _queue_identity_problems(check)
        assert not problems, "queue snapshots differ from their routes:\n  " + "\n  ".join(problems)

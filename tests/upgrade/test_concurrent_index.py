"""A concurrent index build that fails is never taken for done (issue 14 item 2).

``CREATE INDEX CONCURRENTLY`` that times out while it waits for an older writing transaction
leaves an INVALID index behind. The runner must drop it before the retry (``IF NOT EXISTS``
would skip it), record the index phase only with a valid index, and so the final phase must
find the index built and not rebuild it under its exclusive locks.
"""

from __future__ import annotations

import psycopg
import pytest

from pgflow_cli import installer
from pgflow_cli.errors import LockTimeout
from pgflow_cli.installer.events import Event, InvalidIndexDropped, PhaseDone, PhaseStarted
from tests.upgrade.conftest import build_pre_upgrade

INDEX = "pgflow.idx_step_tasks_queue_message"


def _index(conn: psycopg.Connection) -> tuple[int, bool] | None:
    row = conn.execute("SELECT i.indexrelid::bigint, i.indisvalid FROM pg_index AS i "
                       "WHERE i.indexrelid = to_regclass(%s)", (INDEX,)).fetchone()
    return None if row is None else (row[0], row[1])


def test_a_failed_concurrent_build_is_dropped_and_rebuilt_not_recorded(baseline_db):
    build_pre_upgrade(baseline_db.conninfo)
    migrator = baseline_db.connect()
    watcher = baseline_db.connect()
    blocker = psycopg.connect(baseline_db.conninfo, application_name="old-writer")  # not autocommit
    events: list[Event] = []

    def progress(event: Event) -> None:
        events.append(event)
        if isinstance(event, PhaseStarted) and event.phase == "index":
            # an old writer: a row write left open, which every concurrent build must wait out
            blocker.execute("UPDATE pgflow.step_tasks SET attempts_count = attempts_count "
                            "WHERE ctid = (SELECT ctid FROM pgflow.step_tasks LIMIT 1)")

    with pytest.raises(LockTimeout):
        installer.apply(migrator, online="always", lock_timeout=0.5, attempts=2, progress=progress)
    status = {s.version: s for s in installer.make_plan(watcher).statuses}[3]
    assert status.state == "in_progress"
    assert "index" not in status.recorded.phases_done  # never recorded with a failed build
    left = _index(watcher)
    assert left is not None and left[1] is False  # the second attempt's build left an invalid index
    assert [e.index for e in events if isinstance(e, InvalidIndexDropped)] == [INDEX]  # the first one's was dropped

    blocker.rollback()
    built: list[tuple[int, bool] | None] = []

    def record_index(event: Event) -> None:
        if isinstance(event, PhaseDone) and event.phase == "index":
            built.append(_index(watcher))

    installer.apply(migrator, online="always", lock_timeout=5, progress=record_index)
    assert built and built[0] is not None and built[0][1] is True
    assert _index(watcher) == built[0]  # the final phase kept the concurrently built index
    blocker.close()

"""The fence and registration under real row locks, with several connections: a registration in
progress is waited for and its worker deprecated; a lock that never comes free is exit 4 with
nothing changed."""

from __future__ import annotations

import json
import threading
import uuid

from tests.fence.helpers import wait_until


def _waiting_for_a_lock(fenv, application_prefix: str) -> bool:
    return fenv.val("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND application_name LIKE %s", (application_prefix + "%",)) == 1


def test_a_fence_waits_for_a_registration_in_progress_and_deprecates_that_worker(fenv):
    fenv.conn.execute("SELECT pgflow.create_flow('race')")
    fenv.conn.execute("SELECT pgflow.add_step('race', 'only')")
    fenv.conn.execute("SELECT pgflow.track_worker_function('race-worker')")
    registering = fenv.db.connect(autocommit=False)
    worker = uuid.uuid4()
    registering.execute("SELECT pgflow.register_worker(%s, 'race-worker', 'race', 'race')", (worker,))  # row locked

    disable = fenv.cli_background("disable", "--function", "race-worker", "-m", "deploy", "--detach", "--format", "json")
    wait_until(lambda: _waiting_for_a_lock(fenv, "pgflow fence"), "the fence to wait for the registration's row lock")
    registering.commit()
    result = disable.finish()
    assert result.code == 0, result.output
    document = json.loads(result.stdout)
    assert document["functions"][0]["workers_deprecated"] == 1
    assert fenv.val("SELECT deprecated_at IS NOT NULL FROM pgflow.workers WHERE worker_id = %s", (worker,)) is True


def test_a_registration_after_the_fence_commits_is_refused(fenv):
    fenv.conn.execute("SELECT pgflow.create_flow('race')")
    fenv.conn.execute("SELECT pgflow.add_step('race', 'only')")
    fenv.conn.execute("SELECT pgflow.track_worker_function('race-worker')")
    fencing = fenv.db.connect(autocommit=False)
    fencing.execute("SELECT * FROM pgflow.fence_disable(ARRAY['race-worker'], 'deploy')")  # holds the row lock
    registering = fenv.db.connect(autocommit=True)
    registering.execute("SET application_name = 'pgflow-registering'")
    outcome: list[BaseException | None] = []

    def register() -> None:
        try:
            registering.execute("SELECT pgflow.register_worker(%s, 'race-worker', 'race', 'race')", (uuid.uuid4(),))
            outcome.append(None)
        except BaseException as exc:  # the refusal is the expected outcome
            outcome.append(exc)

    thread = threading.Thread(target=register)
    thread.start()
    wait_until(lambda: _waiting_for_a_lock(fenv, "pgflow-registering"), "the registration to wait for the fence")
    fencing.commit()
    thread.join(timeout=60)
    assert len(outcome) == 1 and getattr(outcome[0], "sqlstate", None) == "PF001"
    assert fenv.val("SELECT count(*) FROM pgflow.workers") == 0


def test_a_lock_that_never_comes_free_is_exit_4_and_nothing_changes(fenv):
    fenv.conn.execute("SELECT pgflow.track_worker_function('held-fn')")
    holder = fenv.db.connect(autocommit=False)
    holder.execute("SELECT * FROM pgflow.worker_functions WHERE function_name = 'held-fn' FOR UPDATE")
    result = fenv.cli("disable", "--function", "held-fn", "-m", "deploy", "--lock-timeout", "0.2", "--retries", "2")
    assert result.code == 4, result.output
    assert "gave up after 2 attempt(s)" in result.stderr
    holder.rollback()
    assert fenv.enabled("held-fn") is True and fenv.val("SELECT count(*) FROM pgflow.fences") == 0

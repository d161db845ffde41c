"""The published 0.8.1 database with runs in every state: adopt, upgrade (0003), finish with new workers.

Runs were left by the 0.8.1 functions: completed, failed, queued, started by a worker that
vanished, retry pending (backoff), map fan-out half done. After adoption and the queue-identity
upgrade, protocol-2 reference workers finish every in-flight run: each task runs exactly once,
every message is archived, and finished work is left as it was.
"""

from __future__ import annotations

import psycopg
import pytest

from pgflow_cli import installer
from pgflow_cli.errors import ExitCode
from pgflow_cli.upstream import adopt as adoption
from pgflow_cli.upstream import recognise as rec
from tests.support import inflight
from tests.support.cli import run_cli
from tests.support.invariants import assert_runtime_invariants
from tests.upgrade.conftest import flows

QUEUES = ("orderflow", "fanout")

FINISHED_OUTPUTS = {("completed", "validate"): {"ok": True}, ("completed", "charge"): {"charged": 10},
                    ("completed", "ship"): {"parcel": "p1"}}
"""The completed steps of runs finished before adoption (what the history backfill fills)."""


def _finished_outputs(conn, state) -> dict[tuple[str, str], object]:
    return {(name, step): conn.execute("SELECT output FROM pgflow.step_states WHERE run_id = %s AND step_slug = %s",
                                       (state.runs[name], step)).fetchone()[0]
            for name, step in FINISHED_OUTPUTS}


@pytest.mark.parametrize("online", ["never", "always"])
def test_adopted_release_finishes_every_run_exactly_once(inflight_db, online):
    """``never``: the whole adoption in one transaction. ``always`` (a large database's path): only
    the runs in flight are backfilled inside it, and the workers finish them while the history
    backfill of finished runs has not run; ``migrate apply`` leaves it (get_run_with_states computes
    those outputs), ``migrate apply --fill-history`` stores the rest."""
    database, state = inflight_db
    conn = database.connect()
    before = inflight.task_rows(conn)
    assert inflight.run_statuses(conn, state) == {
        "completed": "completed", "failed": "failed", "queued": "started", "started": "started",
        "retry_pending": "started", "map_half_done": "started"}

    with psycopg.connect(database.conninfo, autocommit=True) as migrator:
        adoption.adopt(migrator, rec.recognise(migrator), online=online)
        if online == "never":
            result = run_cli("migrate", "apply", "--dsn", database.conninfo)
            assert result.code == ExitCode.OK, result.output
            assert "applied 0003_queue_stage" in result.stderr
        else:  # the migrations, as `migrate apply` runs them before the history backfill
            assert "0003_queue_stage" in [a.migration.label for a in installer.apply(migrator)]
            assert adoption.history_pending(migrator) is not None
    deferred = online == "always"
    assert _finished_outputs(conn, state) == ({key: None for key in FINISHED_OUTPUTS} if deferred
                                              else FINISHED_OUTPUTS)

    assert conn.execute("SELECT pgflow.protocol_version()").fetchone()[0] == 2
    assert {k: {**v} for k, v in inflight.task_rows(conn).items()} == before  # the upgrade moved no task

    inflight.release_stalled_and_retry(conn, state, before)
    handled, inputs = inflight.run_workers_until_idle(database.conninfo, conn, lambda wrap: flows(wrap)[:2])

    assert inflight.run_statuses(conn, state) == {
        "completed": "completed", "failed": "failed", "queued": "completed", "started": "completed",
        "retry_pending": "completed", "map_half_done": "completed"}
    runs = {k: str(v) for k, v in state.runs.items()}
    expected = inflight.in_flight_tasks(state)
    assert sorted(handled) == sorted(expected), "every in-flight task ran exactly once, nothing else ran"
    # inputs follow the baseline contract; outputs from before adoption feed them (the backfill)
    assert inputs[(runs["retry_pending"], "charge", 0)] == {"validate": {"ok": True}}
    assert inputs[(runs["map_half_done"], "process", 2)] == 3
    assert inputs[(runs["map_half_done"], "collect", 0)] == {"process": [10, 20, 30, 40]}
    output = conn.execute("SELECT output FROM pgflow.runs WHERE run_id = %s", (state.runs["map_half_done"],)
                          ).fetchone()[0]
    assert output == {"collect": 100}

    after = inflight.task_rows(conn)
    for key, row in before.items():  # work finished before adoption was left alone
        if row["status"] in ("completed", "failed"):
            assert after[key] == row
    assert after[(state.runs["started"], "validate", 0)]["attempts_count"] == 2
    assert after[(state.runs["retry_pending"], "charge", 0)]["attempts_count"] == 2

    inflight.assert_every_message_archived(conn, QUEUES)
    assert_runtime_invariants(conn)

    if deferred:  # now the history, when asked for: every finished run's outputs, and nothing else changed
        finished = inflight.task_rows(conn)
        plain = run_cli("migrate", "apply", "--dsn", database.conninfo)
        assert plain.code == ExitCode.OK and "history backfill" not in plain.stdout, plain.output  # not by default
        assert _finished_outputs(conn, state) == {key: None for key in FINISHED_OUTPUTS}
        shown = conn.execute("SELECT pgflow.get_run_with_states(%s)", (state.runs["completed"],)).fetchone()[0]
        assert {s["step_slug"]: s["output"] for s in shown["steps"]} == {
            step: output for (_, step), output in FINISHED_OUTPUTS.items()}  # computed from the tasks (0011)
        result = run_cli("migrate", "apply", "--fill-history", "--dsn", database.conninfo)
        assert result.code == ExitCode.OK, result.output
        assert "history backfill (adoption, online)" in result.stdout
        with psycopg.connect(database.conninfo) as check:
            assert adoption.history_pending(check) is None
        assert _finished_outputs(conn, state) == FINISHED_OUTPUTS
        assert inflight.task_rows(conn) == finished
        assert_runtime_invariants(conn)

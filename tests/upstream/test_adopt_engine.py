"""The adoption is a step of the installer's engine: ``--sql`` renders it through the same steps
(for review only), and its online completion builds its index the way a migration's ``notx`` phase
does (retried on a lock timeout, an invalid leftover of a failed build dropped before the next one,
the step recorded only with a valid index)."""

from __future__ import annotations

import psycopg
import pytest

from pgflow_cli.errors import ExitCode, LockTimeout
from pgflow_cli.installer.events import Event, InvalidIndexDropped, PhaseStarted, Retrying
from pgflow_cli.upstream import adopt as adoption
from pgflow_cli.upstream import recognise as rec
from tests.support.cli import run_cli
from tests.support.fingerprint import fingerprint

INDEX = "pgflow.idx_step_states_skipped"


def _index_valid(conn: psycopg.Connection) -> bool | None:
    row = conn.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (INDEX,)).fetchone()
    return None if row is None else row[0]


def test_a_failed_build_of_the_adoption_index_is_retried_dropped_and_never_recorded(inflight_db):
    database, _state = inflight_db
    blocker = psycopg.connect(database.conninfo, application_name="old-writer")  # not autocommit
    seen: list[Event] = []

    def progress(event: Event) -> None:
        seen.append(event)
        if isinstance(event, PhaseStarted) and event.phase == "index":
            # an old writer: a row write left open, which every concurrent build must wait out
            blocker.execute("UPDATE pgflow.step_states SET status = status "
                            "WHERE ctid = (SELECT ctid FROM pgflow.step_states LIMIT 1)")

    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        with pytest.raises(LockTimeout):
            adoption.adopt(conn, rec.recognise(conn), online="always", lock_timeout=0.5, attempts=2,
                           progress=progress)
        assert [e.step for e in seen if isinstance(e, Retrying)] == [adoption.COMPLETION_LABEL]
        assert [e.index for e in seen if isinstance(e, InvalidIndexDropped)] == [INDEX]  # the first try's leftover
        assert _index_valid(conn) is False  # the second try's leftover
        assert adoption.pending_completion(conn)[0] == {"step": "index"}  # not recorded with a failed build

        blocker.rollback()
        left = [s for s in adoption.pending_completion(conn) if s["step"] != adoption.HISTORY_STEP]
        assert adoption.complete(conn, history=False) == len(left)
        assert _index_valid(conn) is True
        assert [s["step"] for s in adoption.pending_completion(conn)] == [adoption.HISTORY_STEP]
    blocker.close()


def test_the_adoption_is_rendered_for_review_by_the_steps_apply_runs(release_db):
    """The review text is the adoption step rendered: its transaction with the lock plan, the three
    parts, the adoption record and the ledger rows the engine records, each a statement; what only
    the tool does (the recheck under the locks, the constraints to validate) is said in comments."""
    before = fingerprint(release_db.conninfo)
    result = run_cli("migrate", "apply", "--sql", "--dsn", release_db.conninfo)
    assert result.code == ExitCode.OK, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("-- FOR REVIEW ONLY (not runnable as is): adopt pgflow 0.8.0/0.8.1/0.9.0/0.9.1")
    body = [line[3:] if line.startswith("-- ") else line[2:] for line in lines[1:]]
    assert all(line.startswith("--") for line in lines)
    assert body[:2] == ["-- ===== adoption of pgflow 0.8.0/0.8.1/0.9.0/0.9.1 =====", "BEGIN;"]
    assert "SELECT pg_advisory_xact_lock(1885824631, 0);" in body[2:6]
    assert 'LOCK TABLE "pgflow"."step_tasks" IN ACCESS EXCLUSIVE MODE;' in body
    assert [line for line in body if line.startswith("-- the tool checks, under these locks, that the catalog is "
                                                     "still what it recognised: installed by pgflow 0.8.0/0.8.1/")]
    text = "\n".join(body)
    assert text.index("-- ==== adoption/schema.sql") < text.index("-- ==== adoption/finish.sql") \
        < text.index("INSERT INTO pgflow.schema_adoption") < text.index("-- the ledger rows")
    ledger = [line for line in body if line.startswith("VALUES (") and "'baseline_" in line]
    assert [line.split(", ")[1] for line in ledger] == ["'baseline_schema'", "'baseline_runtime'"]
    assert body[-1] == "COMMIT;"
    assert "0003_queue_stage" not in result.stdout
    assert fingerprint(release_db.conninfo) == before

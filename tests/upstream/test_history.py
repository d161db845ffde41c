"""The history backfill of an online adoption: the outputs of runs that finished before it.

A large database's adoption backfills only the runs in flight inside its transaction
(tests/upstream/test_adopt_inflight.py shows they finish correctly without the rest); the
finished runs' step outputs are filled after the migrations, in batches that record the page
they reached. These tests interrupt it (an exception between batches, a real SIGKILL of
``pgflow migrate apply``), check what ``migrate status`` says meanwhile, and resume it.
"""

from __future__ import annotations

import contextlib
import json
import signal

import psycopg

from pgflow_cli import installer
from pgflow_cli.errors import ExitCode
from pgflow_cli.upstream import adopt as adoption
from pgflow_cli.upstream import recognise as rec
from tests.support.cli import kill_cli_when, run_cli
from tests.support.upstream_shapes import LOAD_STEPS, load_finished_runs
from tests.upstream.history import OUTPUTS, finish_runs

RUNS = 3000
"""30,000 completed steps: several hundred step_states pages, more than the first batch takes."""

WRONG = """
SELECT count(*) FROM pgflow.step_states AS ss
JOIN pgflow.step_tasks AS t ON t.run_id = ss.run_id AND t.step_slug = ss.step_slug
WHERE ss.output IS DISTINCT FROM t.output
"""
"""Completed steps whose output is not their task's (the loaded steps are all single, one task each)."""


def _missing(conn) -> int:
    return conn.execute("SELECT count(*) FROM pgflow.step_states WHERE output IS NULL").fetchone()[0]


def test_the_history_backfill_resumes_at_the_page_it_recorded(release_db):
    load_finished_runs(release_db.conninfo, RUNS)

    class Stop(Exception):
        pass

    batches: list[dict] = []

    def stop_after_two_batches(event: str, data: dict) -> None:
        if event == "batch":
            batches.append(data)
            if len(batches) == 2:
                raise Stop()

    with psycopg.connect(release_db.conninfo, autocommit=True) as conn:
        adoption.adopt(conn, rec.recognise(conn), online="always")
        assert _missing(conn) == RUNS * LOAD_STEPS  # finished runs only: nothing backfilled yet
        with contextlib.suppress(Stop):
            adoption.complete(conn, history=True, batch_seconds=0.001, progress=stop_after_two_batches)
        second = batches[1]
        recorded = adoption.history_pending(conn)
        assert recorded is not None and recorded.next_page == second["first_page"] + second["pages"]
        assert recorded.next_page < recorded.pages  # stopped part way
        done = RUNS * LOAD_STEPS - _missing(conn)
        assert done == batches[0]["rows"] + second["rows"] > 0  # exactly the two committed batches

        batches.clear()
        assert adoption.complete(conn, history=True, batch_seconds=0.001,
                                 progress=lambda e, d: batches.append(d) if e == "batch" else None) == 1
        assert batches[0]["first_page"] == recorded.next_page  # resumed, not started again
        assert sum(b["rows"] for b in batches) == RUNS * LOAD_STEPS - done
        assert _missing(conn) == 0 and conn.execute(WRONG).fetchone()[0] == 0
        assert adoption.history_pending(conn) is None and adoption.pending_completion(conn) == []


def _history_batch_committed(watcher: psycopg.Connection) -> bool:
    if not watcher.execute("SELECT to_regclass('pgflow.schema_adoption') IS NOT NULL").fetchone()[0]:
        return False
    row = watcher.execute("SELECT pending FROM pgflow.schema_adoption WHERE completed_at IS NULL").fetchone()
    return bool(row) and any(s["step"] == adoption.HISTORY_STEP and s["next_page"] > 0 for s in row[0])


def test_a_killed_history_backfill_is_reported_by_status_and_resumed_by_fill_history(release_db):
    load_finished_runs(release_db.conninfo, RUNS)
    dsn = release_db.conninfo

    # tiny batches: the history backfill takes many transactions, the kill lands between or inside one
    killed = kill_cli_when(dsn, "migrate", "apply", "--fill-history", "--online", "always", "--batch-seconds", "0.01",
                           "--dsn", dsn, ready=_history_batch_committed, what="a committed batch of the history backfill")
    assert killed.code == -signal.SIGKILL
    assert "applied 0003_queue_stage" in killed.stderr  # the migrations committed before it started

    with psycopg.connect(dsn) as conn:
        missing = _missing(conn)
        assert 0 < missing < RUNS * LOAD_STEPS  # part of the history is filled, part is not
        assert conn.execute("SELECT pgflow.protocol_version()").fetchone()[0] == 2
        left = adoption.history_pending(conn)
    assert left is not None and left.next_page > 0

    # optional since 0011: status says so, is up to date, and names the option that continues it
    status = run_cli("migrate", "status", "--dsn", dsn)
    assert status.code == ExitCode.OK, status.output
    text = " ".join(status.stdout.split())
    assert "up to date" in text and "adoption is not finished" not in text, status.output
    assert (f"the history backfill has not stored the step outputs of runs that finished before the adoption "
            f"(page {left.next_page} of {left.pages})") in text, status.output
    assert "until `pgflow migrate apply --fill-history` stores them" in text
    report = json.loads(run_cli("migrate", "status", "--dsn", dsn, "--format", "json").stdout)
    assert report["verdict"] == "up_to_date" and report["pending"] == []
    assert report["upstream"]["completion"] == []
    assert report["upstream"]["history"] == {"step": "backfill", "next_page": left.next_page}

    plain = run_cli("migrate", "apply", "--dsn", dsn, timeout=300)  # not by default
    assert plain.code == ExitCode.OK and "history backfill" not in plain.stdout, plain.output
    rerun = run_cli("migrate", "apply", "--fill-history", "--dsn", dsn, timeout=300)
    assert rerun.code == ExitCode.OK, rerun.output
    assert "applied 0003" not in rerun.stderr and "history backfill (adoption, online)" in rerun.stdout
    with psycopg.connect(dsn) as conn:
        assert _missing(conn) == 0 and conn.execute(WRONG).fetchone()[0] == 0
        assert adoption.history_pending(conn) is None
    after = run_cli("migrate", "status", "--dsn", dsn)
    assert after.code == ExitCode.OK and "up to date" in after.stdout, after.output
    assert "history backfill" not in after.stdout


def test_get_run_with_states_shows_the_same_outputs_before_and_after_the_history_backfill(release_db):
    """Migration 0011: a completed step whose output was never stored (a run finished before the
    adoption) shows the output computed from its tasks, single and map steps alike, exactly what
    the history backfill (``--fill-history``) then stores; the document does not change when it
    runs, and ``pgflow runs show --show-output`` shows the same."""
    with psycopg.connect(release_db.conninfo, autocommit=True) as conn:
        named = finish_runs(conn)
        single, mapped, empty = named["single"], named["mapped"], named["empty"]
        runs = (single, mapped, empty)

        adoption.adopt(conn, rec.recognise(conn), online="always")
        installer.apply(conn)
        assert _missing_completed(conn) > 0  # nothing stored yet for the finished runs

        def documents() -> dict:
            return {run: conn.execute("SELECT pgflow.get_run_with_states(%s)", (run,)).fetchone()[0] for run in runs}

        def outputs(document: dict) -> dict:
            return {s["step_slug"]: s["output"] for s in document["steps"]}

        shown = documents()
        assert {name: outputs(shown[run]) for name, run in named.items()} == OUTPUTS
        # `pgflow runs show --show-output` shows the same for the stored NULLs
        listed = run_cli("runs", "show", str(mapped), "--show-output", "--format", "json", "--dsn", release_db.conninfo)
        assert listed.code == ExitCode.OK, listed.output
        assert {s["step_slug"]: s["output"] for s in json.loads(listed.stdout)["steps"]} == outputs(shown[mapped])

        adoption.complete(conn, history=True)
        assert _missing_completed(conn) == 0
        assert documents() == shown  # the stored outputs are the ones shown before


def _missing_completed(conn) -> int:
    return conn.execute("SELECT count(*) FROM pgflow.step_states WHERE status = 'completed' AND output IS NULL"
                        ).fetchone()[0]

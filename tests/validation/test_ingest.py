"""The ingestion application, hand-rolled and step-queued: same domain outcomes, and how each
behaves on success, retry, a killed worker, foreign and fatal messages, and concurrent workers.

Spec "Integration validation". Figures and discussion: docs/validation.md.
"""

from __future__ import annotations

import os
import time
import uuid

import psycopg
from psycopg.types.json import Jsonb

from examples.ingest import domain
from tests.validation.helpers import App
from tests.worker.helpers import wait_until

DOCUMENTS = int(os.environ.get("PGFLOW_VALIDATION_DOCUMENTS", "24"))
"""Documents of the concurrency test; CI runs 24, a longer run sets e.g. 500."""
FAULTS = [(3, "fetch", "fail_once"), (5, "enrich", "fail_once"), (7, "parse", "fail_always")]


def _ingest(app: App, n: int, faults=(), per_stage: int = 1) -> None:
    app.setup()
    app.start_all(per_stage)
    app.submit(domain.sample_documents(n), faults)
    app.wait_terminal()


def test_both_versions_reach_the_same_domain_outcomes(db, db2):
    apps = [App("handrolled", db.conninfo), App("stepqueues", db2.conninfo)]
    try:
        for app in apps:
            _ingest(app, 12, FAULTS)
        hand, queued = (domain.outcomes(app.conn) for app in apps)
        assert hand == queued
        statuses = {row[0]: row[1] for row in hand}
        assert statuses[10] == "failed"  # missing source: permanent, fails at once
        assert statuses[7] == "failed"  # parse fails on every attempt: attempts exhausted
        assert [d for d, s in statuses.items() if s == "done"] == [1, 2, 3, 4, 5, 6, 8, 9, 11, 12]
        for app in apps:
            done = {(d, s) for d in (1, 2, 4, 6) for s in domain.STAGES}
            assert {k: v for k, v in app.effects().items() if k in done} == dict.fromkeys(done, 1)
    finally:
        for app in apps:
            app.close()


def test_retry_once_then_success_and_exhaustion(app):
    _ingest(app, 3, [(1, "enrich", "fail_once"), (2, "parse", "fail_always")])
    assert app.status(1) == "done" and app.calls(1, "enrich") == 2
    assert app.effects()[(1, "enrich")] == 1
    assert app.status(2) == "failed" and app.calls(2, "parse") == 3  # max attempts 3 in both versions
    assert "injected failure" in app.conn.execute("SELECT error FROM ingest.documents WHERE id = 2").fetchone()[0]
    assert app.status(3) == "done" and app.calls(3, "enrich") == 1


def test_the_last_attempt_applies_the_domain_failure_in_that_attempt(db):
    """Gap 3 closed: the step-queued handler sees its last attempt and marks the document failed
    itself, before pgflow records the exhausted task; no one polls failed runs afterwards."""
    app = App("stepqueues", db.conninfo)
    try:
        _ingest(app, 2, [(2, "parse", "fail_always")])
        assert (app.status(1), app.status(2), app.calls(2, "parse")) == ("done", "failed", 3)
        marked, error = app.conn.execute("SELECT updated_at, error FROM ingest.documents WHERE id = 2").fetchone()

        # the handler fails the document during its last attempt; the worker's report of that
        # attempt lands afterwards, so wait for it (on a loaded machine it can trail the document)
        def parse_task_failed():
            return app.conn.execute(
                "SELECT t.started_at, t.failed_at, t.attempts_count FROM pgflow.step_tasks t "
                "JOIN pgflow.runs r USING (run_id) WHERE (r.input->>'doc_id')::int = 2 AND t.step_slug = 'parse' "
                "AND t.failed_at IS NOT NULL").fetchone()

        started_at, failed_at, attempts = wait_until(parse_task_failed, "the parse task of document 2 failed")
        assert attempts == 3 and started_at <= marked <= failed_at  # during the last attempt, before its report
        assert error == "parse: injected failure in parse of document 2"
    finally:
        app.close()


def test_worker_killed_mid_task_is_recovered_and_applied_once(db):
    for version in ("handrolled", "stepqueues"):
        app = App(version, db.conninfo, env={"INGEST_VT_ENRICH": "3"})
        try:
            if version == "stepqueues":
                app.conn.execute("TRUNCATE ingest.documents, ingest.index_terms, ingest.stage_calls, "
                                 "ingest.stage_effects, ingest.faults")
            app.setup()
            for stage in ("fetch", "parse", "index"):
                app.start_worker(stage)
            victim = app.start_worker("enrich")
            app.submit(domain.sample_documents(3), [(2, "enrich", "hang_once")])
            victim.wait_for_line("HANGING enrich 2")
            victim.kill()  # SIGKILL: no drain, no report; the task/message stays claimed
            killed = time.monotonic()
            app.start_worker("enrich")
            app.wait_terminal()
            print(f"\n{version}: killed enrich task recovered and finished {time.monotonic() - killed:.1f}s after SIGKILL")
            assert [row[1] for row in domain.outcomes(app.conn)] == ["done", "done", "done"]
            assert app.calls(2, "enrich") == 2
            assert set(app.effects().values()) == {1} and len(app.effects()) == 12
        finally:
            app.close()


def test_foreign_and_fatal_messages_in_a_step_queue(app):
    app.setup()
    app.start_all()
    parse_worker = app.workers[1]
    send = "SELECT pgmq.send(%s, %s)"
    app.conn.execute(send, (app.queue("parse"), Jsonb({"hello": "world"})))
    wait_until(lambda: app.archived("parse") == [{"hello": "world"}], "the foreign message archived")
    fatal = {"flow_slug": "ingestDoc", "run_id": str(uuid.uuid4()), "step_slug": "parse", "task_index": 0}
    app.conn.execute(send, (app.queue("parse"), Jsonb(fatal)))
    app.submit(domain.sample_documents(3))
    if app.version == "handrolled":
        # It cannot tell pgflow-looking work from junk: no doc_id, so it archives the message too.
        app.wait_terminal()
        assert app.archived("parse")[1] == fatal and parse_worker.popen.poll() is None
        return
    # pgflow: the step worker stops, its function is paused, the message is preserved.
    assert parse_worker.wait() == 1
    reason = app.conn.execute("SELECT paused_reason FROM pgflow.worker_functions "
                              "WHERE function_name = 'ingestDoc-parse-worker' AND NOT enabled").fetchone()[0]
    assert "task_missing" in reason
    assert fatal in app.in_queue("parse")
    wait_until(lambda: domain.status_counts(app.conn) == {"fetched": 3}, "documents waiting after fetch")
    # The operator's fix (docs/claim-protocol.md "After a fatal stop"): archive it, re-enable, restart.
    msg_id = app.conn.execute(psycopg.sql.SQL("SELECT msg_id FROM pgmq.{} WHERE message->>'run_id' = %s").format(
        psycopg.sql.Identifier("q_" + app.queue("parse"))), (fatal["run_id"],)).fetchone()[0]
    app.conn.execute("SELECT pgmq.archive(%s, %s::bigint)", (app.queue("parse"), msg_id))
    app.conn.execute("UPDATE pgflow.worker_functions SET enabled = true WHERE function_name = 'ingestDoc-parse-worker'")
    app.start_worker("parse")
    app.wait_terminal()
    assert [row[1] for row in domain.outcomes(app.conn)] == ["done", "done", "done"]


def test_several_workers_per_step_apply_each_stage_once(app):
    _ingest(app, DOCUMENTS, per_stage=3)
    outcomes = domain.outcomes(app.conn)
    done = [row[0] for row in outcomes if row[1] == "done"]
    assert {row[0] for row in outcomes if row[1] == "failed"} == set(range(10, DOCUMENTS + 1, 10))
    assert len(done) == DOCUMENTS - DOCUMENTS // 10
    effects = app.effects()
    assert set(effects.values()) == {1}
    assert {k for k in effects} == {(d, s) for d in done for s in domain.STAGES}
    calls = dict(((d, s), n) for d, s, n in app.conn.execute(
        "SELECT doc_id, stage, count(*) FROM ingest.stage_calls GROUP BY 1, 2").fetchall())
    assert all(calls[(d, s)] == 1 for d in done for s in domain.STAGES)
    workers = app.conn.execute("SELECT stage, count(DISTINCT worker) FROM ingest.stage_calls GROUP BY 1").fetchall()
    print(f"\n{app.version}: distinct workers per stage {dict(workers)}")


def test_provider_retry_after_is_honoured_by_both_versions(db):
    """Gap 1 (#655), closed: the provider says "retry after 20 s"; when does the retry run?

    Measured as the gap between the rate-limited call and the retried call of the same document.
    Hand-rolled: ``pgmq.set_vt`` with the provider's value. Step-queued: the handler raises
    ``RetryLater(retry_after)``, which fail_task uses instead of the backoff (2 s here). Both retry
    20 s later (within 1 s) with the same attempt count.
    """
    gaps, attempts = {}, {}
    for version in ("handrolled", "stepqueues"):
        app = App(version, db.conninfo)
        try:
            if version == "stepqueues":
                app.conn.execute("TRUNCATE ingest.documents, ingest.index_terms, ingest.stage_calls, "
                                 "ingest.stage_effects, ingest.faults")
            app.setup()
            app.start_all()
            app.submit(domain.sample_documents(1), [(1, "enrich", "rate_limited_once")])
            app.wait_terminal()
            assert app.status(1) == "done"
            attempts[version] = app.calls(1, "enrich")
            gaps[version] = float(app.conn.execute(
                "SELECT extract(epoch FROM max(at) - min(at)) FROM ingest.stage_calls "
                "WHERE doc_id = 1 AND stage = 'enrich'").fetchone()[0])
            if version == "stepqueues":
                task = app.conn.execute(
                    "SELECT t.attempts_count, t.requested_retry_delay FROM pgflow.step_tasks t "
                    "JOIN pgflow.runs r USING (run_id) WHERE (r.input->>'doc_id')::int = 1 AND t.step_slug = 'enrich'"
                ).fetchone()
                assert task == (2, int(domain.RATE_LIMIT_RETRY_AFTER))  # recorded with the failure
        finally:
            app.close()
    print(f"\nretry ran {gaps} s after the rate-limited call (provider said {domain.RATE_LIMIT_RETRY_AFTER} s)")
    assert attempts == {"handrolled": 2, "stepqueues": 2}
    for version, gap in gaps.items():
        assert domain.RATE_LIMIT_RETRY_AFTER - 0.5 <= gap < domain.RATE_LIMIT_RETRY_AFTER + 1, (version, gap)

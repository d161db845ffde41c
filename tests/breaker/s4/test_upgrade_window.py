"""An upgrade interrupted between the migration that creates a re-applied function file
create-only and the one that runs it in full (docs/architecture.md "Function files in a run").

The interruption is real: a ``before_commit`` hook raises in a later migration, so everything
before it is committed and that migration is rolled back, as a killed ``pgflow migrate apply``
leaves it. Workers keep running against that level until the run is resumed.
"""

from __future__ import annotations

import re

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_cli import installer, sqlfiles
from pgflow_cli.installer.files import Migration
from tests.upgrade.test_reapplied_files import at_level


class Interrupted(Exception):
    pass


def _interrupt_at(version: int):
    def hook(_conn: psycopg.Connection, migration: Migration) -> None:
        if migration.version == version:
            raise Interrupted(f"killed in {migration.label}")
    return hook


def _started_task(conn: psycopg.Connection) -> tuple:
    conn.execute("SELECT pgflow.create_flow('window')")
    conn.execute("SELECT pgflow.add_step('window', 'a')")
    run = conn.execute("SELECT run_id FROM pgflow.start_flow('window', %s)", (Jsonb({}),)).fetchone()[0]
    # the claim of an older worker: the task started (what any protocol's claim leaves)
    conn.execute("UPDATE pgflow.step_tasks SET status = 'started', started_at = now(), attempts_count = 1 "
                 "WHERE run_id = %s", (run,))
    return run, "a", 0


@pytest.mark.parametrize("start, stop", [(2, 11), (9, 13), (2, 14)])
def test_complete_tasks_works_while_an_upgrade_from_below_0010_is_interrupted(start, stop, baseline_db, monkeypatch):
    """A worker of this pgflow-cli reports through complete_tasks as soon as it exists
    (sql/queries/worker_v2.sql: to_regprocedure); an upgrade interrupted after 0010 (killed, or a
    long phase of a later migration: lock waits, a concurrent index) leaves it callable."""
    conn = baseline_db.connect()
    conn.autocommit = True
    at_level(conn, start, monkeypatch)
    with pytest.raises(Interrupted):
        installer.apply(conn, before_commit=_interrupt_at(stop))
    assert max(s.version for s in installer.make_plan(conn).statuses if s.state == "applied") == stop - 1
    assert conn.execute("SELECT to_regprocedure('pgflow.complete_tasks(jsonb)') IS NOT NULL").fetchone()[0]
    run, step, index = _started_task(conn)
    rows = conn.execute("SELECT status FROM pgflow.complete_tasks(%s)", (Jsonb(
        [{"run_id": str(run), "step_slug": step, "task_index": index, "output": 1}]),)).fetchall()
    assert rows == [("completed",)]
    # resumed, the run ends with every file current
    installer.apply(conn)
    assert {f.state for f in installer.make_plan(conn).files} == {"current"}


def _report(conn: psycopg.Connection, kind: str, claimed: list[tuple], value) -> list[tuple]:
    key = "output" if kind == "complete" else "error_message"
    return conn.execute(f"SELECT status FROM pgflow.{kind}_tasks(%s)", (Jsonb(
        [{"run_id": str(r), "step_slug": s, "task_index": i, key: value} for r, s, i in claimed]),)).fetchall()


@pytest.mark.parametrize("stop", list(range(4, 17)))
def test_a_worker_keeps_working_at_every_level_an_upgrade_from_the_baseline_can_stop_at(stop, baseline_db):
    """start_flow(s), claim_tasks, complete_task(s), fail_tasks and requeue_stalled_tasks, at the level
    an upgrade from 0002 leaves when the migration ``stop`` is rolled back (finding F1 of the s4
    breaker: complete_tasks and start_flows raised 42883 at levels 10-13, their newest text calling
    helpers of 0013/0014; the texts now fall back to the older path while a helper is missing)."""
    conn = baseline_db.connect()
    conn.autocommit = True
    with pytest.raises(Interrupted):
        installer.apply(conn, before_commit=_interrupt_at(stop))
    conn.execute("SELECT pgflow.create_flow('window', max_attempts => 2, base_delay => 0)")
    conn.execute("SELECT pgflow.add_step('window', 'a')")
    conn.execute("SELECT pgflow.add_step('window', 'b', ARRAY['a'])")
    conn.execute("SELECT pgflow.start_flow('window', '{}'::jsonb)")
    has = conn.execute("SELECT to_regprocedure('pgflow.start_flows(text, jsonb)') IS NOT NULL").fetchone()[0]
    if has:
        conn.execute("SELECT * FROM pgflow.start_flows('window', %s)", (Jsonb([{"n": 1}, {"n": 2}]),))
    worker = conn.execute("SELECT w FROM gen_random_uuid() AS w, pgflow.register_worker(w, 'fn', 'window', 'window', NULL)"
                          ).fetchone()[0]

    def claim() -> list[tuple]:
        ids = [r[0] for r in conn.execute("SELECT msg_id FROM pgmq.read('window', 30, 10)").fetchall()]
        rows = conn.execute("SELECT outcome, run_id, step_slug, task_index FROM pgflow.claim_tasks('window', %s, %s, "
                            "'window')", (ids, worker)).fetchall()
        assert {r[0] for r in rows} == {"claimed"}
        return [r[1:] for r in rows]

    first = claim()
    assert len(first) == (3 if has else 1)
    conn.execute("SELECT pgflow.complete_task(%s, %s, %s, '1'::jsonb)", first[0])
    if has:
        assert _report(conn, "fail", first[1:2], "boom") == [("queued",)]
        if not 11 <= stop <= 13:
            assert _report(conn, "complete", first[2:], 2) == [("completed",)]
    conn.execute("SELECT pgflow.requeue_stalled_tasks()")
    assert claim()  # the next steps (and the retried task) came out
    installer.apply(conn)
    assert installer.make_plan(conn).pending == []


FUNCTION_TEXTS = """
SELECT p.oid::regprocedure::text, pg_catalog.pg_get_functiondef(p.oid)
FROM pg_catalog.pg_proc AS p
WHERE p.pronamespace = 'pgflow'::regnamespace AND p.prokind IN ('f', 'p')
"""


def _defined_names(path: str) -> set[str]:
    return {m.lower() for m in re.findall(r"CREATE\s+OR\s+REPLACE\s+FUNCTION\s+(pgflow\.\w+)\s*\(",
                                          sqlfiles.load(path), flags=re.IGNORECASE)}


@pytest.mark.parametrize("start", [2, 3, 9, 12])
def test_no_function_that_existed_before_a_run_gets_a_later_text_before_its_full_run(start, baseline_db, monkeypatch):
    """At the commit of every migration of a run, a function that existed when the run began and whose
    file a later migration of the run applies in full still has its pre-run text: the create-only
    subtransaction never leaves the newer text visible to workers (docs/architecture.md "Function
    files in a run")."""
    conn = baseline_db.connect()
    conn.autocommit = True
    at_level(conn, start, monkeypatch)
    before = dict(conn.execute(FUNCTION_TEXTS).fetchall())
    todo = installer.make_plan(conn).pending
    last_full: dict[str, int] = {}
    for m in todo:
        for a in m.applies:
            last_full[a.path] = m.version
    deferred_names: dict[str, int] = {}  # function name -> the version that runs its file in full
    for path, version in last_full.items():
        for name in _defined_names(path):
            deferred_names[name] = max(deferred_names.get(name, 0), version)
    # a migration's once-only SQL may itself drop and recreate a function (0005's register_worker)
    once_only_touch = {name for m in todo for name in deferred_names
                       if re.search(rf"(drop|create\s+or\s+replace)\s+function\s+(if\s+exists\s+)?{re.escape(name)}\s*\(",
                                    m.text, flags=re.IGNORECASE)}
    problems: list[str] = []
    checked: list[str] = []

    def hook(c: psycopg.Connection, migration: Migration) -> None:
        now = dict(c.execute(FUNCTION_TEXTS).fetchall())
        for sig, text in before.items():
            name = sig.split("(")[0]
            full_at = deferred_names.get(name)
            if full_at is None or full_at <= migration.version or name in once_only_touch:
                continue
            checked.append(sig)
            if now.get(sig) != text:
                problems.append(f"{migration.label}: {sig} changed before {full_at:04d} runs its file in full")

    installer.apply(conn, before_commit=hook)
    assert problems == []
    assert len(set(checked)) >= 3, (start, sorted(set(checked)))  # the check had something to check


CALLEES = """
SELECT p.oid::regprocedure::text AS caller, m[1] AS callee
FROM pg_catalog.pg_proc AS p
CROSS JOIN LATERAL regexp_matches(p.prosrc, 'pgflow\\.([a-z_0-9]+)\\s*\\(', 'g') AS m
WHERE p.pronamespace = 'pgflow'::regnamespace
  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS q WHERE q.pronamespace = 'pgflow'::regnamespace AND q.proname = m[1])
  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class AS c WHERE c.relnamespace = 'pgflow'::regnamespace AND c.relname = m[1])
ORDER BY 1, 2
"""


@pytest.mark.parametrize("stop", list(range(4, 17)))
def test_at_every_level_an_upgrade_from_the_baseline_can_stop_at_no_function_names_a_missing_one(stop, baseline_db):
    """A static scan: every ``pgflow.<name>(`` in an installed function body names a function (or a
    table, for a row constructor or cast) that exists at that level, or is called only behind a
    to_regprocedure guard (findings F1 and F3 of the s4 breaker, fixed that way: texts created early
    by 0005 and 0010 that call helpers of 0009, 0013 and 0014)."""
    conn = baseline_db.connect()
    conn.autocommit = True
    with pytest.raises(Interrupted):
        installer.apply(conn, before_commit=_interrupt_at(stop))
    missing = conn.execute(CALLEES).fetchall()
    # names a body calls only behind a to_regprocedure guard (the older path follows where they are missing)
    guarded = {"_complete_worker_tasks", "_complete_worker_progress", "_start_ready_steps_of_runs", "_set_step_manual"}
    assert {(c, n) for c, n in missing if n not in guarded} == set(), missing


def test_compiling_a_manual_step_while_an_upgrade_stands_between_0005_and_0009_is_refused_clearly(baseline_db):
    """Finding F3 of the s4 breaker: 0005 creates the three-argument _create_flow_from_shape early,
    with its newest text, which calls 0009's _set_step_manual; at levels 5-8 compiling a manual step
    raised 42883. 0016's text refuses it with PF003 naming migration 0009."""
    conn = baseline_db.connect()
    conn.autocommit = True
    with pytest.raises(Interrupted):
        installer.apply(conn, before_commit=_interrupt_at(6))
    shape = {"steps": [{"slug": "a", "stepType": "single", "dependencies": [], "executionMode": "manual"}]}
    try:
        conn.execute("SELECT pgflow.ensure_flow_compiled('probe', %s, protocol_version => 2)", (Jsonb(shape),))
    except psycopg.errors.UndefinedFunction:
        raise
    except psycopg.Error as exc:  # a refusal naming what is missing is the expected answer
        assert "manual" in str(exc).lower() or "migrat" in str(exc).lower(), exc
    assert conn.execute("SELECT count(*) FROM pgflow.steps WHERE flow_slug = 'probe'").fetchone()[0] in (0, 1)

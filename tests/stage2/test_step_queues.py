"""Migration 0005: step-mode startup compilation (spec "Generated per-step names", "Generated
private ownership", "Flow immutability and versions").

Every refusal is checked to leave the database exactly as it was (flows, steps and every PGMQ
queue); collisions and concurrent queue creation are made with real sessions, concurrency is
observed through lock waits (pg_blocking_pids), never sleeps.
"""

from __future__ import annotations

import threading

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_cli.worker import Flow, with_step_queues
from tests.runtime.driver import wait_until_blocked


def noop(value, ctx):
    return value


def flow_of(slug: str, *steps: str) -> Flow:
    flow = Flow(slug)
    for step in steps:
        flow = flow.step(step, noop)
    return flow


def compile_step(conn, flow: Flow, *, route_map=None, mode: str = "step") -> dict:
    if route_map is not None:
        routes = route_map
    elif mode == "step":
        routes = with_step_queues(flow).route_map()
    else:
        routes = [{"stepSlug": s, "queueName": flow.slug.lower()} for s in flow.step_slugs]
    return conn.execute(
        "SELECT pgflow.ensure_flow_compiled(%s, %s, protocol_version => 2, queue_mode => %s, route_map => %s)",
        (flow.slug, Jsonb(flow.shape()), mode, Jsonb(routes)),
    ).fetchone()[0]


def snapshot(conn) -> tuple:
    """Everything a refused compilation must leave unchanged."""
    return (
        conn.execute("SELECT coalesce(array_agg(flow_slug || ':' || queue_mode ORDER BY flow_slug), '{}') FROM pgflow.flows").fetchone()[0],
        conn.execute("SELECT coalesce(array_agg(x ORDER BY x), '{}') FROM (SELECT flow_slug || '/' || step_slug || '@' || queue_name"
                     " AS x FROM pgflow.steps) AS s").fetchone()[0],
        conn.execute("SELECT coalesce(array_agg(queue_name::text ORDER BY queue_name::text), '{}') FROM pgmq.meta").fetchone()[0],
        conn.execute("SELECT coalesce(array_agg(relname::text ORDER BY relname::text), '{}') FROM pg_class c JOIN pg_namespace n "
                     "ON n.oid = c.relnamespace WHERE n.nspname = 'pgmq' AND c.relkind = 'r'").fetchone()[0],
    )


def refused(conn, sqlstate: str, call, *, match: str = "") -> psycopg.Error:
    before = snapshot(conn)
    with pytest.raises(psycopg.Error) as caught:
        call()
    assert caught.value.sqlstate == sqlstate, caught.value
    text = str(caught.value) + "\n" + (caught.value.diag.message_detail or "")
    assert match in text, text
    assert snapshot(conn) == before, "a refused compilation changed something"
    return caught.value


# -------------------------------------------------------------------------------------------------
# compilation, names, idempotence
# -------------------------------------------------------------------------------------------------

def test_compile_persists_mode_routes_and_one_queue_per_step(db):
    conn = db.connect()
    flow = flow_of("Scrape", "fetchPage", "parse")
    result = compile_step(conn, flow)
    assert (result["status"], result["queueMode"]) == ("compiled", "step")
    assert conn.execute("SELECT queue_mode FROM pgflow.flows WHERE flow_slug = 'Scrape'").fetchone()[0] == "step"
    assert conn.execute("SELECT array_agg(queue_name ORDER BY step_index) FROM pgflow.steps").fetchone()[0] == \
        ["scrape__fetchpage", "scrape__parse"]
    assert snapshot(conn)[2] == ["scrape__fetchpage", "scrape__parse"]  # no default queue "scrape"

    before = snapshot(conn)
    again = compile_step(conn, flow)
    assert again["status"] == "verified" and again["routes"] == result["routes"]
    assert snapshot(conn) == before  # idempotent: queues reused, nothing created


def test_names_at_the_47_character_boundary(db):
    conn = db.connect()
    forty = "f" + "a" * 39
    flow = flow_of(forty, "abcde", "abcdef", *(f"s{i}" for i in range(2, 10)), "tenthStep")
    compile_step(conn, flow)
    routes = dict(conn.execute("SELECT step_slug, queue_name FROM pgflow.steps WHERE flow_slug = %s", (forty,)).fetchall())
    assert routes["abcde"] == f"{forty}__abcde" and len(routes["abcde"]) == 47  # readable fits exactly
    assert routes["abcdef"] == f"{forty}__1"  # 48 readable: index fallback
    assert routes["tenthStep"] == f"{forty}__10"  # two-digit index fallback

    forty_three = "g" + "b" * 42
    flow = flow_of(forty_three, *(f"s{i}" for i in range(10)), "longer")
    compile_step(conn, flow)
    assert conn.execute("SELECT queue_name FROM pgflow.steps WHERE step_slug = 'longer'").fetchone()[0] == f"{forty_three}__10"


def test_a_flow_whose_names_cannot_fit_is_rejected_whole(db):
    conn = db.connect()
    slug = "h" + "c" * 44  # 45: "__x" needs 48
    flow = flow_of(slug, "ab", "cd")
    error = refused(conn, "PF003", lambda: compile_step(conn, flow, route_map=[
        {"stepSlug": "ab", "queueName": "x"}, {"stepSlug": "cd", "queueName": "y"}]), match="2 step(s)")
    detail = error.diag.message_detail
    assert 'step "ab" (index 0)' in detail and "has 49 characters" in detail and "has 48" in detail
    assert 'step "cd" (index 1)' in detail


def test_the_workers_route_map_must_match(db):
    conn = db.connect()
    flow = flow_of("routeCheck", "a")
    refused(conn, "PF003", lambda: compile_step(conn, flow, route_map=[{"stepSlug": "a", "queueName": "routecheck"}]),
            match="route map differs")


# -------------------------------------------------------------------------------------------------
# collisions: all refused before any change
# -------------------------------------------------------------------------------------------------

def test_an_existing_queue_with_a_generated_name_is_never_adopted(db):
    conn = db.connect()
    conn.execute("SELECT pgmq.create('adopt__second')")
    flow = flow_of("adopt", "first", "second")
    refused(conn, "PF004", lambda: compile_step(conn, flow), match='"adopt__second" already exists')


def test_an_existing_queue_under_another_letter_case_is_never_adopted(db):
    conn = db.connect()
    conn.execute("SELECT pgmq.create('Adopt__First')")
    flow = flow_of("adopt", "first")
    refused(conn, "PF004", lambda: compile_step(conn, flow), match="never adopts")


def test_a_case_alias_of_an_existing_flow_is_refused(db):
    conn = db.connect()
    compile_step(conn, flow_of("billing", "charge"), mode="flow")
    refused(conn, "PF003", lambda: compile_step(conn, flow_of("Billing", "charge")), match="only by letter case")


def test_a_queue_another_flow_routes_to_or_holds_tasks_in_is_refused(db):
    conn = db.connect()
    compile_step(conn, flow_of("other", "a"))
    # data edited by hand: another flow's persisted route now names the queue this flow generates
    conn.execute("SELECT pgmq.drop_queue('other__a')")
    conn.execute("UPDATE pgflow.steps SET queue_name = 'taken__a' WHERE flow_slug = 'other'")
    refused(conn, "PF004", lambda: compile_step(conn, flow_of("taken", "a")), match='already belongs to flow "other"')


def _compile_in_thread(conninfo: str, flow: Flow) -> tuple[threading.Thread, dict, list]:
    box: dict = {}
    pids: list = []
    conn = psycopg.connect(conninfo, autocommit=True)
    pids.append(conn.info.backend_pid)

    def target():
        try:
            box["result"] = compile_step(conn, flow)
        except psycopg.Error as exc:
            box["error"] = exc
        finally:
            conn.close()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, box, pids


@pytest.mark.parametrize("spelling", ["race__a", "Race__A"])
def test_a_queue_created_during_provisioning_is_never_adopted(db, spelling):
    observer = db.connect()
    creator = db.connect(autocommit=False)
    creator.execute("SELECT pgmq.create(%s)", (spelling,))  # uncommitted: holds its locks
    before_flows = observer.execute("SELECT count(*) FROM pgflow.flows").fetchone()[0]
    thread, box, pids = _compile_in_thread(db.conninfo, flow_of("race", "a"))
    try:
        wait_until_blocked(observer, pids[0])  # the compilation waits on the creator (lock or table)
    finally:
        creator.commit()
    thread.join(60)
    assert "error" in box, box
    assert box["error"].sqlstate == "PF004" and "never adopts" in str(box["error"])
    assert observer.execute("SELECT count(*) FROM pgflow.flows").fetchone()[0] == before_flows
    assert observer.execute("SELECT array_agg(queue_name::text) FROM pgmq.meta").fetchone()[0] == [spelling]


# -------------------------------------------------------------------------------------------------
# versions: mode and routes never change in place
# -------------------------------------------------------------------------------------------------

def test_changing_the_queue_mode_of_an_existing_flow_is_a_mismatch(db):
    conn = db.connect()
    flow = flow_of("modal", "a", "b")
    compile_step(conn, flow, mode="flow")
    before = snapshot(conn)
    result = compile_step(conn, flow)
    assert (result["status"], result["mismatchKind"], result["queueMode"]) == ("mismatch", "routing", "flow")
    assert "queue mode flow" in result["differences"][0] and "queue mode step" in result["differences"][0]
    assert snapshot(conn) == before
    # and back: a step-queued flow never becomes plain
    conn.execute("SELECT pgflow.delete_flow_and_data('modal')")
    compile_step(conn, flow)
    assert compile_step(conn, flow, mode="flow")["status"] == "mismatch"


def test_local_recompilation_switches_mode_and_recreates_queues(db):
    conn = db.connect()
    flow = flow_of("localFlow", "a")
    compile_step(conn, flow, mode="flow")
    conn.execute("SET pgflow.environment = 'local'")
    result = compile_step(conn, flow)
    assert (result["status"], result["queueMode"]) == ("recompiled", "step")
    assert snapshot(conn)[2] == ["localflow__a"]


def test_worker_version_is_recorded_and_old_callers_still_register(db):
    conn = db.connect()
    compile_step(conn, flow_of("versioned", "a"))
    conn.execute("SELECT pgflow.register_worker(gen_random_uuid(), 'fn', 'versioned__a', 'versioned', 'a', "
                 "worker_version => 'release-9')")
    conn.execute("SELECT pgflow.register_worker(gen_random_uuid(), 'fn', 'versioned__a', 'versioned', 'a')")
    assert conn.execute("SELECT array_agg(worker_version ORDER BY worker_version NULLS LAST) FROM pgflow.workers").fetchone()[0] \
        == ["release-9", None]
    with pytest.raises(psycopg.Error) as caught:  # a step worker of a step-queued flow names its step
        conn.execute("SELECT pgflow.register_worker(gen_random_uuid(), 'fn', 'versioned__a', 'versioned')")
    assert caught.value.sqlstate == "PF004"

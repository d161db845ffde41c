"""Workers: registration and the enable fence, heartbeats, stop; the optional HTTP starter and cron.

Workers register with a real route (an existing flow and its queue): the upgraded schema
checks the route, the baseline records it as given.
"""

from __future__ import annotations

import uuid

from tests.runtime.driver import raises_sqlstate


def _route(rt, slug: str) -> tuple[str, str]:
    """Create plain flow ``slug``; return the (queue, flow) a worker of it registers with."""
    rt.flow(slug)
    return rt.queue(slug), slug


def test_register_worker_records_route_and_tracks_function(rt):
    wid = uuid.uuid4()
    queue, flow = _route(rt, "orders")
    rt.conn.execute("SELECT pgflow.register_worker(%s, 'fn-a', %s, %s)", (wid, queue, flow))
    w = rt.one("SELECT * FROM pgflow.workers WHERE worker_id = %s", (wid,))
    assert (w["function_name"], w["queue_name"], w["flow_slug"], w["step_slug"]) == ("fn-a", "orders", "orders", None)
    fn = rt.one("SELECT * FROM pgflow.worker_functions WHERE function_name = 'fn-a'")
    assert fn["enabled"] is True


def test_fenced_function_refuses_registration_with_pf001(rt):
    rt.conn.execute("SELECT pgflow.track_worker_function('fenced-fn')")
    rt.conn.execute("UPDATE pgflow.worker_functions SET enabled = false WHERE function_name = 'fenced-fn'")
    wid = uuid.uuid4()
    queue, flow = _route(rt, "q")
    state = "disabled" if rt.upgraded else "fenced"
    with raises_sqlstate("PF001", rf'worker function "fenced-fn" is {state}') as caught:
        rt.conn.execute("SELECT pgflow.register_worker(%s, 'fenced-fn', %s, %s)", (wid, queue, flow))
    assert "enable" in (caught.error.diag.message_hint or "")  # how to lift the fence
    assert rt.val("SELECT count(*) FROM pgflow.workers") == 0
    # tracking never lifts the fence
    rt.conn.execute("SELECT pgflow.track_worker_function('fenced-fn')")
    assert rt.val("SELECT enabled FROM pgflow.worker_functions WHERE function_name = 'fenced-fn'") is False


def test_track_worker_function_is_idempotent_and_touches_updated_at(rt):
    rt.conn.execute("SELECT pgflow.track_worker_function('fn')")
    first = rt.val("SELECT updated_at FROM pgflow.worker_functions WHERE function_name = 'fn'")
    rt.conn.execute("SELECT pgflow.track_worker_function('fn')")
    second = rt.val("SELECT updated_at FROM pgflow.worker_functions WHERE function_name = 'fn'")
    assert second > first
    assert rt.val("SELECT count(*) FROM pgflow.worker_functions") == 1
    assert rt.val("SELECT last_invoked_at FROM pgflow.worker_functions") is None


def test_heartbeat_reports_deprecation_and_stop(rt):
    wid = uuid.uuid4()
    queue, flow = _route(rt, "q")
    rt.conn.execute("SELECT pgflow.register_worker(%s, 'fn', %s, %s)", (wid, queue, flow))
    before = rt.val("SELECT last_heartbeat_at FROM pgflow.workers WHERE worker_id = %s", (wid,))
    assert rt.val("SELECT pgflow.send_heartbeat(%s)", (wid,)) is False
    assert rt.val("SELECT last_heartbeat_at FROM pgflow.workers WHERE worker_id = %s", (wid,)) > before
    rt.conn.execute("UPDATE pgflow.workers SET deprecated_at = now() WHERE worker_id = %s", (wid,))
    assert rt.val("SELECT pgflow.send_heartbeat(%s)", (wid,)) is True
    assert rt.val("SELECT pgflow.send_heartbeat(%s)", (uuid.uuid4(),)) is True  # unknown worker: stop
    rt.conn.execute("SELECT pgflow.mark_worker_stopped(%s)", (wid,))
    assert rt.val("SELECT stopped_at FROM pgflow.workers WHERE worker_id = %s", (wid,)) is not None


def test_ensure_workers_is_a_no_op_without_pg_net(rt):
    rt.conn.execute("SELECT pgflow.track_worker_function('fn')")
    assert rt.rows("SELECT * FROM pgflow.ensure_workers()") == []
    assert rt.val("SELECT last_invoked_at FROM pgflow.worker_functions") is None


def _fake_pg_net(rt):
    """A stand-in net.http_post that records calls (pg_net is not installed on test servers)."""
    rt.conn.execute(
        """
        CREATE SCHEMA net;
        CREATE TABLE net.calls (id bigserial PRIMARY KEY, url text, headers jsonb);
        CREATE FUNCTION net.http_post(url text, body jsonb DEFAULT '{}', params jsonb DEFAULT '{}',
                                      headers jsonb DEFAULT '{}', timeout_milliseconds integer DEFAULT 5000)
        RETURNS bigint LANGUAGE sql AS
          $$ INSERT INTO net.calls (url, headers) VALUES (url, headers) RETURNING id $$;
        """
    )


def test_ensure_workers_local_pings_enabled_functions_only(rt):
    _fake_pg_net(rt)
    for fn in ("alpha", "beta", "gamma"):
        rt.conn.execute("SELECT pgflow.track_worker_function(%s)", (fn,))
    rt.conn.execute("UPDATE pgflow.worker_functions SET enabled = false WHERE function_name = 'beta'")
    rt.conn.execute("SELECT set_config('pgflow.environment', 'local', false)")
    rows = rt.rows("SELECT * FROM pgflow.ensure_workers() ORDER BY function_name")
    assert [(r["function_name"], r["invoked"]) for r in rows] == [("alpha", True), ("gamma", True)]
    calls = rt.rows("SELECT url, headers FROM net.calls ORDER BY id")
    assert [c["url"] for c in calls] == ["http://kong:8000/functions/v1/alpha", "http://kong:8000/functions/v1/gamma"]
    assert all("Authorization" not in c["headers"] for c in calls)


def test_ensure_workers_production_needs_secrets_and_respects_liveness(rt):
    _fake_pg_net(rt)
    rt.conn.execute("SELECT pgflow.track_worker_function('prod-fn')")
    rt.conn.execute("SELECT pgflow.track_worker_function('alive-fn')")
    assert rt.rows("SELECT * FROM pgflow.ensure_workers()") == []  # no URL, no secret: nothing

    rt.conn.execute(
        """
        CREATE SCHEMA vault;
        CREATE TABLE vault.decrypted_secrets (name text, decrypted_secret text);
        INSERT INTO vault.decrypted_secrets VALUES ('pgflow_auth_secret', 's3cret'), ('supabase_project_id', 'proj');
        """
    )
    queue, flow = _route(rt, "q")
    rt.conn.execute("SELECT pgflow.register_worker(%s, 'alive-fn', %s, %s)", (uuid.uuid4(), queue, flow))
    rows = rt.rows("SELECT * FROM pgflow.ensure_workers()")
    assert [r["function_name"] for r in rows] == ["prod-fn"]
    call = rt.one("SELECT * FROM net.calls")
    assert call["url"] == "https://proj.supabase.co/functions/v1/prod-fn"
    assert call["headers"]["Authorization"] == "Bearer s3cret"
    # debounce: a second call right away pings nobody
    assert rt.rows("SELECT * FROM pgflow.ensure_workers()") == []


def test_cron_setup_needs_pg_cron(rt):
    with raises_sqlstate("0A000", "pg_cron is not installed"):
        rt.conn.execute("SELECT pgflow.setup_requeue_stalled_tasks_cron()")
    with raises_sqlstate("0A000", "pg_cron is not installed"):
        rt.conn.execute("SELECT pgflow.setup_ensure_workers_cron()")
    assert rt.val("SELECT pgflow.cleanup_ensure_workers_logs()") == 0

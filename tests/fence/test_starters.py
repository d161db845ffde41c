"""Nothing starts the old code during a fence: a supervisor's restart is refused at registration,
and the HTTP starter (ensure_workers) never pings a fenced function, locally or in production."""

from __future__ import annotations

import json

import pytest

from tests.fence.helpers import WINDOW, wait_until

FN = "billing-worker"
FLOW = "billing"


def test_a_supervisor_restart_during_the_fence_is_refused_and_registers_nothing(fenv):
    old = fenv.spawn(FN, FLOW)
    runs = fenv.start_runs(FLOW, 1)
    wait_until(lambda: fenv.started(runs) == 1, "the work task in flight")
    result = fenv.cli("disable", "--function", FN, "-m", "rollout 42", "--detach", "--format", "json")
    assert result.code == 0, result.output
    assert json.loads(result.stdout)["outcome"] == "detached"

    # a supervisor restarts the worker (same code, same function) while the old one drains
    restarted = fenv.spawn(FN, FLOW, wait_registered=False)
    assert restarted.wait() == 6
    stderr = "\n".join(restarted.lines("stderr"))
    assert f"REFUSED worker function '{FN}' is disabled" in stderr
    assert "pgflow fence status" in stderr and "pgflow fence restore" in stderr
    assert fenv.val("SELECT count(*) FROM pgflow.workers WHERE worker_id = %s", (restarted.worker_id,)) == 0
    assert restarted.ran() == []

    # the old worker still finishes what it holds and claims nothing new once it has seen the deprecation
    old.wait_for_line("stops polling and drains", "stderr")
    fenv.release()
    assert old.wait() == 0
    assert fenv.task_states(runs) == {("work", "completed"): 1, ("after", "queued"): 1}
    status = fenv.cli("status", "--format", "json", "--heartbeat-window", WINDOW)
    fence = json.loads(status.stdout)["fences"]
    assert [(f["function_name"], f["reason"], f["restore_outlook"]) for f in fence] == [(FN, "rollout 42", "enable again")]


def _fake_pg_net(fenv):
    """A stand-in net.http_post that records its calls (pg_net is not installed on test servers)."""
    fenv.conn.execute(
        """
        CREATE SCHEMA net;
        CREATE TABLE net.calls (id bigserial PRIMARY KEY, url text);
        CREATE FUNCTION net.http_post(url text, body jsonb DEFAULT '{}', params jsonb DEFAULT '{}',
                                      headers jsonb DEFAULT '{}', timeout_milliseconds integer DEFAULT 5000)
        RETURNS bigint LANGUAGE sql AS $$ INSERT INTO net.calls (url) VALUES (url) RETURNING id $$;
        CREATE SCHEMA vault;
        CREATE TABLE vault.decrypted_secrets (name text, decrypted_secret text);
        INSERT INTO vault.decrypted_secrets VALUES ('pgflow_auth_secret', 'not-shown'), ('supabase_project_id', 'proj');
        """
    )


@pytest.mark.parametrize("environment", ["local", "production"])
def test_the_http_starter_never_pings_a_fenced_function(fenv, environment):
    _fake_pg_net(fenv)
    for name in ("fenced-fn", "other-fn"):
        fenv.conn.execute("SELECT pgflow.track_worker_function(%s)", (name,))
    fenv.conn.execute("UPDATE pgflow.worker_functions SET debounce = interval '1 second'")
    if environment == "local":
        fenv.conn.execute("SELECT set_config('pgflow.environment', 'local', false)")
    assert fenv.cli("disable", "--function", "fenced-fn", "-m", "deploy", "--detach").code == 0

    pinged = [r["function_name"] for r in fenv.rows("SELECT * FROM pgflow.ensure_workers() ORDER BY 1")]
    assert pinged == ["other-fn"]
    assert fenv.val("SELECT last_invoked_at FROM pgflow.worker_functions WHERE function_name = 'fenced-fn'") is None

    assert fenv.cli("restore", "--function", "fenced-fn").code == 0
    fenv.conn.execute("UPDATE pgflow.worker_functions SET last_invoked_at = NULL")
    pinged = [r["function_name"] for r in fenv.rows("SELECT * FROM pgflow.ensure_workers() ORDER BY 1")]
    assert pinged == ["fenced-fn", "other-fn"]
    urls = [r["url"] for r in fenv.rows("SELECT url FROM net.calls ORDER BY id")]
    assert not any(u.endswith("/fenced-fn") for u in urls[:1]) and urls[-2].endswith("/fenced-fn")

"""Item 1: is_local() also detects a Supabase local stack; pgflow.environment takes precedence.

docs/compatibility.md item 1. Released pgflow is local exactly when the setting
``app.settings.jwt_secret`` is the Supabase CLI's well-known local JWT secret. From 0006 ours
decides in this order: ``pgflow.environment`` set to 'local' -> local; set to anything else ->
not local; unset or empty -> the released detection.
"""

from __future__ import annotations

from tests.runtime.test_workers import _fake_pg_net

SUPABASE_LOCAL_JWT_SECRET = "super-secret-jwt-token-with-at-least-32-characters-long"
"""The JWT secret every Supabase CLI local stack uses (``supabase status`` prints it); public, not a credential."""


def _set(rt, name: str, value: str) -> None:
    rt.conn.execute("SELECT set_config(%s, %s, false)", (name, value))


def _local(rt) -> bool:
    return rt.val("SELECT pgflow.is_local()")


def _shape(*slugs: str) -> dict:
    return {"steps": [{"slug": s} for s in slugs]}


def test_item_1_is_local_detects_supabase_local_stack(old, new):
    # baseline: only pgflow.environment counts; a Supabase local stack looks like production
    _set(old, "app.settings.jwt_secret", SUPABASE_LOCAL_JWT_SECRET)
    assert _local(old) is False

    # current: unset pgflow.environment -> the released detection
    assert _local(new) is False
    _set(new, "app.settings.jwt_secret", "a-real-project-secret-that-is-long-enough-000")
    assert _local(new) is False
    _set(new, "app.settings.jwt_secret", SUPABASE_LOCAL_JWT_SECRET)
    assert _local(new) is True
    _set(new, "pgflow.environment", "")  # empty counts as unset
    assert _local(new) is True

    # precedence: an explicit pgflow.environment wins over the detection, both ways
    _set(new, "pgflow.environment", "production")
    assert _local(new) is False
    _set(new, "app.settings.jwt_secret", "")
    _set(new, "pgflow.environment", "local")
    assert _local(new) is True

    # the symptoms of the issue: on a Supabase local stack ensure_workers() pings the local
    # functions endpoint, and a changed shape is recompiled
    _fake_pg_net(new)
    new.conn.execute("SELECT pgflow.track_worker_function('local-fn')")
    _set(new, "pgflow.environment", "")
    _set(new, "app.settings.jwt_secret", SUPABASE_LOCAL_JWT_SECRET)
    assert [r["function_name"] for r in new.rows("SELECT * FROM pgflow.ensure_workers()")] == ["local-fn"]
    assert new.val("SELECT url FROM net.calls") == "http://kong:8000/functions/v1/local-fn"
    assert new.compile("localFlow", _shape("a"))["status"] == "compiled"
    assert new.compile("localFlow", _shape("a", "b"))["status"] == "recompiled"
    _set(new, "app.settings.jwt_secret", "")
    assert new.compile("localFlow", _shape("a"))["status"] == "mismatch"

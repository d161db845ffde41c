"""The three roles of docs/permissions.md ("Three roles"), in one place.

Every pgflow function runs with its caller's rights, and a worker needs EXECUTE on nearly all of them
(its entry points reach the internal ones), so EXECUTE cannot separate the roles. Membership does:
the entry points of :data:`GUARDED` call ``pgflow._require_caller(<group role>, <action>)`` first,
which raises 42501 unless the caller owns the pgflow tables or is a member of that group role
(``pgflow_operator`` members also pass where ``pgflow_trusted`` is asked).

:data:`GUARDED` is read by the tests (each function is refused to the worker recipe, and every
function file that calls ``_require_caller`` is listed here under the role it names) and by the
docs (docs/permissions.md lists the same functions); :data:`RECIPES` are the grants
docs/permissions.md shows, verbatim, and the tests apply them. A new operator or trusted entry
point is one line in :data:`GUARDED` and one ``PERFORM pgflow._require_caller(...)`` in its file.
"""

from __future__ import annotations

OPERATOR = "pgflow_operator"
TRUSTED = "pgflow_trusted"

GUARDED: dict[str, tuple[str, ...]] = {
    OPERATOR: (
        "pgflow.fence_disable(text[], text)",
        "pgflow.fence_restore(text[])",
        "pgflow.drop_flow(text, boolean)",
        "pgflow.delete_flow_and_data(text)",  # not when pgflow.is_local(): local recompilation runs as the worker
        "pgflow.prune_runs(timestamp with time zone, uuid, integer, boolean)",
        "pgflow.prune_archive(text, timestamp with time zone, integer, boolean)",
        "pgflow.cancel_run(uuid, text)",
        "pgflow.retry_run(uuid)",
        "pgflow.resume_run(uuid)",
    ),
    TRUSTED: (
        "pgflow.complete_manual_task(uuid, text, integer, jsonb)",
        "pgflow.fail_manual_task(uuid, text, integer, text)",
    ),
}
"""Group role -> the entry points only its members (and the owner of the pgflow tables) may call."""

RECIPES: dict[str, str] = {
    "worker": """\
CREATE ROLE pgflow_worker LOGIN PASSWORD '...';
GRANT USAGE ON SCHEMA pgflow TO pgflow_worker;
GRANT USAGE, CREATE ON SCHEMA pgmq TO pgflow_worker;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgflow TO pgflow_worker;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgflow TO pgflow_worker;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgmq TO pgflow_worker;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA pgmq TO pgflow_worker;
""",
    "trusted": """\
CREATE ROLE pgflow_trusted NOLOGIN;
GRANT USAGE ON SCHEMA pgflow, pgmq TO pgflow_trusted;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgflow TO pgflow_trusted;
GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA pgflow TO pgflow_trusted;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgmq TO pgflow_trusted;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA pgmq TO pgflow_trusted;
CREATE ROLE pgflow_approvals LOGIN PASSWORD '...' IN ROLE pgflow_trusted;
""",
    "operator": """\
CREATE ROLE pgflow_operator NOLOGIN;
GRANT USAGE ON SCHEMA pgflow, pgmq TO pgflow_operator;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgflow TO pgflow_operator;
GRANT SELECT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgflow TO pgflow_operator;
GRANT INSERT ON pgflow.fences TO pgflow_operator;
GRANT SELECT, DELETE ON pgmq.meta TO pgflow_operator;
CREATE ROLE alice LOGIN IN ROLE pgflow_operator;
""",
}
"""The recipe of each role, as docs/permissions.md shows it (role names as written there)."""

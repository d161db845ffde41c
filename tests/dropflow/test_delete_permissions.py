"""`delete_flow_and_data` run by a role that may not touch a queue's tables ends with a permission error
(42501) naming the queue, not an internal null-identifier error; nothing is deleted."""

from __future__ import annotations

from tests.dropflow.test_grants import _as, _login
from tests.permissions.test_worker_role import ROLE_GRANTS
from tests.runtime.driver import raises_sqlstate
from tests.support.roles import ensure_group


def test_a_queue_table_without_a_grant_is_a_permission_error_naming_it(rt, db):
    admin = rt.conn
    maintainer = _login(admin, "maintainer")
    admin.execute(ROLE_GRANTS.format(role=f'"{maintainer}"'))
    admin.execute(f'GRANT {ensure_group(admin, "pgflow_operator")} TO "{maintainer}"')  # may delete flows
    # created after the grants, by the owner: the maintainer holds nothing on this flow's queue tables
    admin.execute("SELECT pgflow.create_flow('late'), pgflow.add_step('late', 'a')")
    run_id = rt.start("late", {})
    before = {table: rt.val(f"SELECT count(*) FROM {table}")
              for table in ("pgflow.runs", "pgflow.step_tasks", "pgflow.flows", "pgmq.q_late", "pgmq.meta")}
    with raises_sqlstate("42501", f'role "{maintainer}" may not drop the queue tables of flow "late": '
                                  'queue "late" \\(tables owned by "'):
        _as(db, maintainer).execute("SELECT pgflow.delete_flow_and_data('late')")
    assert {table: rt.val(f"SELECT count(*) FROM {table}") for table in before} == before
    assert rt.run(run_id)["status"] == "started"

    # the same role, once it may act as the tables' owner, deletes everything
    owner = rt.val("SELECT tableowner FROM pg_tables WHERE schemaname = 'pgmq' AND tablename = 'q_late'")
    admin.execute(f'GRANT "{owner}" TO "{maintainer}"')
    _as(db, maintainer).execute("SELECT pgflow.delete_flow_and_data('late')")
    assert rt.val("SELECT count(*) FROM pg_tables WHERE schemaname = 'pgmq' AND tablename LIKE '%%late'") == 0
    assert rt.val("SELECT count(*) FROM pgflow.flows WHERE flow_slug = 'late'") == 0

-- 0003 queue identity, part 2: functions. Included by 0003_queue_identity.sql (main phase);
-- its text counts toward that migration's checksum, so it is as immutable as the migration.
--
-- Conventions as in 0002: search_path = '', everything schema-qualified, PF SQLSTATEs
-- (docs/architecture.md), "#variable_conflict use_column" where parameters share column names.
-- Flow advisory locks: (1, hashtext(lower(flow_slug))) first, then (1, hashtext(flow_slug)):
-- the normalized key serializes case aliases at definition time; the exact key is the one
-- start_flow (shared) and deletion already use, so runs never start during a deletion.

------------------------------------------------------------------------------------------------
-- Protocol and names
------------------------------------------------------------------------------------------------

--@include functions/workers/protocol_version.sql

--@include functions/definitions/default_queue_name.sql as-create

--@include functions/definitions/step_queue_name.sql as-create

--@include released/0003/functions/queues/_listed_queue_name.sql as-create

--@include released/0003/functions/queues/_queue_exists.sql as-create

--@include functions/queues/_assert_queue_unclaimed.sql as-create

------------------------------------------------------------------------------------------------
-- Queue helpers: the snapshot decides (docs/architecture.md "Queue operations go through two helpers")
------------------------------------------------------------------------------------------------

--@include functions/queues/_archive_task_messages.sql

--@include released/0003/functions/queues/_set_task_messages_vt.sql

------------------------------------------------------------------------------------------------
-- Definitions
------------------------------------------------------------------------------------------------

--@include functions/definitions/create_flow.sql

--@include functions/definitions/add_step.sql

--@include released/0003/functions/definitions/_shape_problems.sql as-create

--@include functions/definitions/ensure_flow_compiled_protocol1.sql

--@include released/0003/functions/definitions/ensure_flow_compiled.sql as-create

--@include released/0003/functions/definitions/delete_flow_and_data.sql

------------------------------------------------------------------------------------------------
-- Runtime: send to the persisted route, snapshot it on the task
------------------------------------------------------------------------------------------------

--@include released/0003/functions/runtime/start_ready_steps.sql

--@include functions/claim/start_tasks.sql

--@include migrations/0003/claim.sql

--@include functions/claim/poll_for_tasks.sql

------------------------------------------------------------------------------------------------
-- Workers
------------------------------------------------------------------------------------------------

--@include released/0003/functions/workers/register_worker.sql

--@include functions/workers/_clear_pause_on_enable.sql as-create

------------------------------------------------------------------------------------------------
-- Optional pruning: upgraded in place when installed (spec "installed pruning functions have an
-- explicit upgrade path"); sql/optional/prune.sql is the same text for new installs.
------------------------------------------------------------------------------------------------

DO $upgrade_prune$
BEGIN
  IF pg_catalog.to_regprocedure('pgflow.prune_data_older_than(interval)') IS NOT NULL THEN
    EXECUTE $prune_sql$
--@include optional/prune.sql
$prune_sql$;
  END IF;
END
$upgrade_prune$;

-- Roles that could run the protocol-1 entry points get the protocol-2 ones and the new functions
-- they call, so the upgrade takes no right away from an existing worker role (docs/permissions.md).
-- Nobody else gets anything.
DO $grants$
DECLARE
  v_role text;
BEGIN
  FOR v_role IN
    SELECT r.rolname FROM pg_catalog.pg_roles AS r
    WHERE NOT r.rolsuper AND r.rolname <> current_user AND r.rolname !~ '^pg_'
      AND (pg_catalog.has_function_privilege(r.oid, 'pgflow.start_tasks(text, bigint[], uuid)', 'EXECUTE')
           OR pg_catalog.has_function_privilege(r.oid, 'pgflow.ensure_flow_compiled(text, jsonb)', 'EXECUTE'))
    ORDER BY r.rolname
  LOOP
    EXECUTE pg_catalog.format(
      'GRANT EXECUTE ON FUNCTION pgflow.claim_tasks(text, bigint[], uuid, text, text),
                                 pgflow.ensure_flow_compiled(text, jsonb, integer, text, jsonb),
                                 pgflow.is_valid_queue_name(text), pgflow.slug_violations(text),
                                 pgflow.default_queue_name(text), pgflow.step_queue_name(text, text, integer),
                                 pgflow._listed_queue_name(text), pgflow._queue_exists(text),
                                 pgflow._assert_queue_unclaimed(text, text), pgflow._shape_problems(text, jsonb)
       TO %I', v_role);
  END LOOP;
END
$grants$;

-- Nothing in pgflow is reachable by PUBLIC (docs/permissions.md).
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgflow FROM PUBLIC;

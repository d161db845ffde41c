-- 0010 throughput (issue 18): the protocol calls do only what the flow needs, claims are driven by
-- unique keys whatever the table sizes and statistics, and batch entry points report many tasks
-- and start many runs in one call. Function files only: no table is altered, so no table lock.
--
-- Run advancement: the condition cascade runs only for a flow with a condition, the empty-map
-- cascade only for a flow with a map step, run completion only when no step is left; a started
-- step's realtime payload is built only when realtime.send exists. (_complete_task_progress is
-- left to 0009, whose grants need it to exist when an upgrade from below 0009 runs them.)
--@apply functions/runtime/_advance_run.sql sha256=efa8b02395b5c4f88bae1f5b0f341ec839f0119473e1d42f7564ce6344ec2093
--@apply functions/runtime/start_ready_steps.sql sha256=d4ec0d441e3e420eb1c50f4ba7baddb72a2e023982e86df8c3faa329d34e4ed6
-- Batch reports: complete_tasks (one element is complete_task without its own archive; one
-- archive per queue for the batch) and fail_tasks (one fail_task per element).
--@apply functions/runtime/_complete_worker_task.sql sha256=a2579b499f6c7e0ac730e424187221396ba1f68895d2c17e8a020cba16e5da5c
--@apply functions/runtime/complete_tasks.sql sha256=6b325f0a8afefcbe6c90b75bf6021900c2ddffdedbb64952c9d8504463584185
--@apply functions/runtime/fail_tasks.sql sha256=02ad10c05f2a753d7a750984792c22d2590fba704b9c717c00227edccb1e922b
-- Starting runs: one set-based core for start_flow and start_flows.
--@apply functions/runtime/_start_runs.sql sha256=39cd64014594a98ed07863331a875144c6f49885f99710056c1bb2e122901d4e
--@apply functions/runtime/start_flow.sql sha256=7854121ca9d01c68d672a6346dfe287a698c4878abbb012d737be54491760f0c
--@apply functions/runtime/start_flows.sql sha256=fa74be693992697fd3157f5895b874eea21abf46f98654e19b7d510ff35e3b8d
-- The claim: the run and step state looked up by key like the task, each verdict computed once.
--@apply functions/claim/claim_tasks.sql sha256=1dc9b93af1c208667a7012a779f28059f2818362e6de65778cc04c41c9987fdb

-- Grants: a role that can run an entry point today can run what it now calls, and its batch form
-- (the recipe of docs/permissions.md grants EXECUTE on the schema's functions once, before the
-- upgrade). PUBLIC gets nothing; Supabase's client roles get nothing either, whatever they hold.
DO $grants$
DECLARE
  v_pair text[];
  v_role name;
BEGIN
  -- {function a role may call today, what 0010 lets it call as well}
  FOREACH v_pair SLICE 1 IN ARRAY ARRAY[
    ['pgflow.complete_task(uuid, text, integer, jsonb)', 'pgflow._complete_worker_task(uuid, text, integer, jsonb)'],
    ['pgflow.complete_task(uuid, text, integer, jsonb)', 'pgflow.complete_tasks(jsonb)'],
    ['pgflow.fail_task(uuid, text, integer, text)', 'pgflow.fail_tasks(jsonb)'],
    ['pgflow.start_flow(text, jsonb, uuid)', 'pgflow._start_runs(text, text, jsonb, uuid)'],
    ['pgflow.start_flow(text, jsonb, uuid)', 'pgflow.start_flows(text, jsonb)']
  ] LOOP
    FOR v_role IN
      SELECT r.rolname FROM pg_catalog.pg_roles AS r
      WHERE pg_catalog.has_function_privilege(r.oid, v_pair[1], 'EXECUTE')
        AND NOT r.rolsuper AND r.rolname <> current_user AND r.rolname !~ '^pg_'
        AND r.rolname NOT IN ('anon', 'authenticated')
      ORDER BY 1
    LOOP
      EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %I', v_pair[2], v_role);
    END LOOP;
  END LOOP;
  -- Supabase's client roles: never, whatever default privileges gave them
  FOR v_role IN SELECT r.rolname FROM pg_catalog.pg_roles AS r WHERE r.rolname IN ('anon', 'authenticated') ORDER BY 1 LOOP
    EXECUTE pg_catalog.format(
      'REVOKE ALL ON FUNCTION pgflow.complete_tasks(jsonb), pgflow.fail_tasks(jsonb), pgflow.start_flows(text, jsonb), '
      'pgflow._complete_worker_task(uuid, text, integer, jsonb), pgflow._start_runs(text, text, jsonb, uuid) FROM %I', v_role);
  END LOOP;
END
$grants$;

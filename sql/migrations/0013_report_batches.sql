-- 0013 report batches (issue 18): a worker's completions cost fewer statements. Function files
-- only: no table is altered, so no table lock.
--
-- A worker task's success reported alone (complete_task) has its own progression
-- (_complete_worker_progress): the step state is decremented and completed in one UPDATE, so
-- PostgreSQL does not check its foreign keys a second time (it re-checks them on every further
-- update of a row the transaction already changed), and the step's realtime event is built only
-- where realtime.send exists. It hands a [TYPE_VIOLATION] to 0009's shared core
-- _complete_task_progress, which manual completion and complete_tasks' elements keep using: 0009
-- and 0010 grant on those functions, so no later migration may be the one that creates them in
-- an upgrade from below 0009 / 0010 (each file runs once, in the last pending migration).
--@apply functions/runtime/_complete_worker_progress.sql sha256=796afcac3f953112327b29360959bae91c843c9fc0e797dc9c7f941f3f2b9f80
--@apply functions/runtime/complete_task.sql sha256=a7950599e08143e80adbf3c6cd777247ef945ee1e40029bb7d2dbad4a27bef53
-- Run advancement (every completion, complete_tasks' elements included): the flow's flags and
-- the run's state in one look-up, ready steps looked for only while a step is left, and started
-- with one UPDATE.
--@apply functions/runtime/_advance_run.sql sha256=4cda4747efd8905701a6d45b6ee496399c272c4f36c023ea57dde187bff20d64
--@apply functions/runtime/start_ready_steps.sql sha256=a0319070d2e997e6cbfc143594ae207702df9c86a7fdb71db21921e7dd8664a0

-- Grants: a role that can complete tasks today can run the internal function its completions
-- now reach; PUBLIC and Supabase's client roles get nothing.
DO $grants$
DECLARE
  v_role name;
BEGIN
  FOR v_role IN
    SELECT r.rolname FROM pg_catalog.pg_roles AS r
    WHERE r.rolname IN ('anon', 'authenticated')
       OR (pg_catalog.has_function_privilege(r.oid, 'pgflow.complete_task(uuid, text, integer, jsonb)', 'EXECUTE')
           AND NOT r.rolsuper AND r.rolname <> current_user AND r.rolname !~ '^pg_')
    ORDER BY 1
  LOOP
    EXECUTE pg_catalog.format(
      CASE WHEN v_role IN ('anon', 'authenticated')
           THEN 'REVOKE ALL ON FUNCTION pgflow._complete_worker_progress(uuid, text, integer, jsonb) FROM %I'
           ELSE 'GRANT EXECUTE ON FUNCTION pgflow._complete_worker_progress(uuid, text, integer, jsonb) TO %I' END,
      v_role);
  END LOOP;
END
$grants$;

-- 0014 batch completions (issue 18): complete_tasks applies a batch of independent worker
-- completions with one statement per table instead of a chain of calls per element. Function
-- files only: no table is altered, so no table lock.
--
-- A batch whose elements name different runs, all started, with started queue tasks, no
-- [TYPE_VIOLATION] possible and no realtime.send goes through _complete_worker_tasks: every
-- element's step state and task locked in array order, then tasks, step states, children and
-- runs updated set-wise, and each run moved on in array order. Any other batch, or one whose
-- set-based pass raises, goes element by element as before (the error then names its element).
-- An element completes through _complete_worker_progress (0013's progression of complete_task:
-- one step-state update), no longer 0009's shared core.
-- complete_tasks and fail_tasks share their text (parts/report_worker_tasks.sql): both are applied.
-- The runs the pass moves on start their ready steps together when their flows have no condition
-- and no map step and those steps share a queue and a start delay: _start_ready_steps_of_runs (one
-- UPDATE, one pgmq.send_batch, one INSERT), the only sender besides start_ready_steps.
-- (0010 creates these files' functions and grants them: in an upgrade from below 0010 the
-- installer creates them there and replaces them here, docs/architecture.md "Function files in a run".)
--@apply functions/runtime/_start_ready_steps_of_runs.sql sha256=d996bb3e4274ec7ba5ae33abd3384f190316426b6127d1f3d81dd098615c73ad
--@apply functions/runtime/_complete_worker_tasks.sql sha256=81eb5b2f328221f042efb9968cdfd0b6b3d3fd18077af9693fe7d5deefbff374
--@apply functions/runtime/_complete_worker_task.sql sha256=8c95032a58cae6028aea1c5a58b6f903e630ed91221e3af8ae8f66cd70586df9
--@apply functions/runtime/complete_tasks.sql sha256=16e81b89f8c59da4894f8753cc1de0cdfe60039a3551ee6d83a2a567dedf6da2
--@apply functions/runtime/fail_tasks.sql sha256=ff34fba898a805f5aacf05f9234bd77ce0cf1f258868020c64e73e7eb3a996ab

-- Starting runs: start_flows' runs of a flow without conditions, map or manual steps start their
-- root steps together (_start_ready_steps_of_runs), unless realtime.send exists.
--@apply functions/runtime/_start_runs.sql sha256=5bd93e369dde50f271aea8be66c59a3cc7273d2b1c2448ec052740fc1cba6e52

-- Grants: a role that can report batches or start runs today can run what those now reach;
-- PUBLIC and Supabase's client roles get nothing.
DO $grants$
BEGIN
  EXECUTE coalesce((
    SELECT pg_catalog.string_agg(pg_catalog.format(
             CASE WHEN g.rolname IN ('anon', 'authenticated') THEN 'REVOKE ALL ON FUNCTION %2$s FROM %1$I'
                  ELSE 'GRANT EXECUTE ON FUNCTION %2$s TO %1$I' END, g.rolname, g.functions), '; ' ORDER BY g.rolname, g.n)
    FROM (
      SELECT r.rolname, 1 AS n, 'pgflow._complete_worker_tasks(uuid[], text[], integer[], jsonb[]), '
                                'pgflow._complete_worker_progress(uuid, text, integer, jsonb), '
                                'pgflow._start_ready_steps_of_runs(uuid[])' AS functions
      FROM pg_catalog.pg_roles AS r
      WHERE r.rolname IN ('anon', 'authenticated')
         OR (pg_catalog.has_function_privilege(r.oid, 'pgflow.complete_tasks(jsonb)', 'EXECUTE')
             AND NOT r.rolsuper AND r.rolname <> current_user AND r.rolname !~ '^pg_')
      UNION ALL
      SELECT r.rolname, 2, 'pgflow._start_ready_steps_of_runs(uuid[])'
      FROM pg_catalog.pg_roles AS r
      WHERE pg_catalog.has_function_privilege(r.oid, 'pgflow.start_flows(text, jsonb)', 'EXECUTE')
        AND NOT r.rolsuper AND r.rolname <> current_user AND r.rolname !~ '^pg_'
        AND r.rolname NOT IN ('anon', 'authenticated')
    ) AS g), 'SELECT 1');
END
$grants$;

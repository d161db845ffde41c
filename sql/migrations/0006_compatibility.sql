-- 0006 compatibility: where ours differed from released pgflow without a reason, match it
-- (issue 17; every decision, kept differences included, is in docs/compatibility.md).
--
--   item 1  is_local() also detects a Supabase local stack (the CLI's local JWT secret);
--           an explicit pgflow.environment still decides first;
--   item 2  cleanup_ensure_workers_logs() returns TABLE (cron_deleted bigint);
--   item 3  _get_flow_shape() of an unknown flow is {"steps": []};
--   item 4  a [TYPE_VIOLATION] failure keeps the offending output on the failed task;
--   item 8  check constraints get the released names (conditions unchanged).
--
-- Data is not touched: failed tasks of earlier type violations keep their NULL output.
-- Locks: the renames take a brief ACCESS EXCLUSIVE lock on runs, step_states and deps, in the
-- order the runtime reaches them (a run row, its step states, then definition reads), catalog
-- only (no scan, no rewrite). Each rename runs only while the old name is there and the
-- released one is not, so a database that already has the released names passes unchanged.
-- The installer takes these locks first, all or none (docs/architecture.md "Locks a migration takes").
--@lock pgflow.runs ACCESS EXCLUSIVE
--@lock pgflow.step_states ACCESS EXCLUSIVE
--@lock pgflow.deps ACCESS EXCLUSIVE

LOCK TABLE pgflow.runs, pgflow.step_states, pgflow.deps IN ACCESS EXCLUSIVE MODE;

DO $rename$
DECLARE
  v_table text;
  v_ours text;
  v_released text;
BEGIN
  FOR v_table, v_ours, v_released IN
    VALUES ('runs', 'runs_status_check', 'status_is_valid'),
           ('runs', 'remaining_steps_valid', 'runs_remaining_steps_check'),
           ('step_states', 'output_only_for_completed', 'output_only_for_completed_or_null'),
           ('step_states', 'initial_tasks_nonnegative', 'step_states_initial_tasks_check'),
           ('step_states', 'remaining_deps_valid', 'step_states_remaining_deps_check'),
           ('step_states', 'at_most_one_terminal_timestamp', 'completed_at_or_failed_at_or_skipped_at'),
           ('deps', 'deps_not_self', 'deps_check')
  LOOP
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_constraint AS c
               WHERE c.conrelid = pg_catalog.format('pgflow.%I', v_table)::regclass AND c.conname = v_ours)
       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint AS c
                       WHERE c.conrelid = pg_catalog.format('pgflow.%I', v_table)::regclass AND c.conname = v_released) THEN
      EXECUTE pg_catalog.format('ALTER TABLE pgflow.%I RENAME CONSTRAINT %I TO %I', v_table, v_ours, v_released);
    END IF;
  END LOOP;
END
$rename$;

--@apply functions/supabase/is_local.sql sha256=ebd1620d802fccfb05c2aeb612682126f5ddcc5aa3c23ed953c0458e98f76571
--@apply functions/supabase/cleanup_ensure_workers_logs.sql sha256=4f096ced7b662e0ab64a701bbced90ce10f4f2803250eb1042e847969df70f8a
--@apply functions/definitions/_get_flow_shape.sql sha256=758e3322657a10e46978b31dbf615a1a5de6fb787e13bfed97109bb5f8e4c7c2
--@apply functions/runtime/complete_task.sql sha256=39d1a71f1c10d9021055dc7cf7eb5ca1a79d7280e496aec82c1467d0d8edd3a5

-- Fails one manual task from trusted server code, inside the caller's transaction. Addressed like
-- complete_manual_task; error_message (required, stored on the task and step) says why. A manual
-- task never retries: its failure is final exhaustion and the step's when_exhausted decides (fail:
-- the run fails and its other unfinished tasks are cancelled; skip; skip-cascade), the one way every
-- started task fails for good (_fail_started_task). No PGMQ call for this task.
-- Returns the task row. Repeating the same failure returns the stored row and progresses nothing;
-- errors PF009 not found, PF010 not manual, PF011 not active, PF012 conflict, 22004 for a NULL
-- error_message (docs/manual-tasks.md). SECURITY INVOKER.
CREATE OR REPLACE FUNCTION pgflow.fail_manual_task(run_id uuid, step_slug text, task_index integer, error_message text)
RETURNS pgflow.step_tasks
LANGUAGE plpgsql
VOLATILE
SECURITY INVOKER
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_task pgflow.step_tasks;
BEGIN
  PERFORM pgflow._require_caller('pgflow_trusted', 'fail manual tasks');
  IF fail_manual_task.error_message IS NULL THEN
    RAISE EXCEPTION 'fail_manual_task(): error_message must not be NULL' USING ERRCODE = '22004';
  END IF;
  v_task := pgflow._lock_manual_task('fail_manual_task', fail_manual_task.run_id, fail_manual_task.step_slug,
                                     fail_manual_task.task_index, 'failed', NULL, fail_manual_task.error_message);
  IF v_task.status <> 'started' THEN
    RETURN v_task;
  END IF;
  RETURN pgflow._fail_started_task(fail_manual_task.run_id, fail_manual_task.step_slug, fail_manual_task.task_index,
                                   fail_manual_task.error_message, false, NULL);
END;
$$;
REVOKE ALL ON FUNCTION pgflow.fail_manual_task(uuid, text, integer, text) FROM PUBLIC;

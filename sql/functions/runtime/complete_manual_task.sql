-- Completes one manual task (execution_mode 'manual': no queue, no worker) from trusted server
-- code, inside the caller's transaction: the application's own rows and the workflow's progression
-- commit or roll back together. Addressed by run id, step slug and task index (0 for a single
-- step, the item index of a map step). output: the task's JSON output (SQL NULL is stored as JSON
-- null); a single step that feeds a map step must return an array.
-- Locks run -> step state -> task (_lock_manual_task), then completes the task the one way every
-- task completes (_complete_started_tasks: map aggregation in task_index order, children released,
-- conditions, taskless cascades, run completion; a [TYPE_VIOLATION] fails the run). No PGMQ call
-- for this task.
-- Returns the task row. Repeating the same completion returns the stored row and progresses
-- nothing; errors PF009 not found, PF010 not manual, PF011 not active, PF012 conflict
-- (docs/manual-tasks.md). SECURITY INVOKER: the caller needs the grants of docs/permissions.md.
CREATE OR REPLACE FUNCTION pgflow.complete_manual_task(run_id uuid, step_slug text, task_index integer, output jsonb)
RETURNS pgflow.step_tasks
LANGUAGE plpgsql
VOLATILE
SECURITY INVOKER
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_output jsonb := coalesce(complete_manual_task.output, 'null'::jsonb);
  v_task pgflow.step_tasks;
BEGIN
  PERFORM pgflow._require_caller('pgflow_trusted', 'complete manual tasks');
  v_task := pgflow._lock_manual_task('complete_manual_task', complete_manual_task.run_id, complete_manual_task.step_slug,
                                     complete_manual_task.task_index, 'completed', v_output, NULL);
  IF v_task.status <> 'started' THEN
    RETURN v_task;
  END IF;
  RETURN (pgflow._complete_started_tasks(ARRAY[complete_manual_task.run_id], ARRAY[complete_manual_task.step_slug],
                                         ARRAY[complete_manual_task.task_index], ARRAY[v_output], 'manual'))[1];
END;
$$;
REVOKE ALL ON FUNCTION pgflow.complete_manual_task(uuid, text, integer, jsonb) FROM PUBLIC;

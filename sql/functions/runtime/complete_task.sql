-- Records a worker task's success: output is what the handler returned (a single step that feeds a
-- map step must return an array). A report may come late or twice: a late call (run or step no
-- longer started, task terminal) changes nothing and archives the task's message idempotently; a
-- queued task (stalled recovery queued it again) is left alone with its message, for its next
-- claim; an unknown run or task returns nothing; a manual task is refused (PF010)
-- (_lock_worker_task). Otherwise the task completes through _complete_started_tasks (step
-- completion, map outputs in task_index order, children released, the run moves on; a
-- [TYPE_VIOLATION] fails the run) and its message is archived.
-- Locks: the run FOR NO KEY UPDATE, then its step state FOR UPDATE; when this report may end the
-- step (its step state is not started, or this is its last remaining task), the run FOR UPDATE
-- too, before any task row is locked; then the task (docs/runtime.md "Lock order"). A completion
-- that only counts a step down so does not wait for, nor hold up, the run's claims.
-- Returns the task row.
CREATE OR REPLACE FUNCTION pgflow.complete_task(run_id uuid, step_slug text, task_index integer, output jsonb)
RETURNS SETOF pgflow.step_tasks
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_task pgflow.step_tasks;
  v_report record;
  v_counts_down boolean;
BEGIN
  PERFORM 1 FROM pgflow.runs AS r WHERE r.run_id = complete_task.run_id FOR NO KEY UPDATE;
  SELECT ss.status = 'started' AND ss.remaining_tasks > 1 INTO v_counts_down
  FROM pgflow.step_states AS ss
  WHERE ss.run_id = complete_task.run_id AND ss.step_slug = complete_task.step_slug
  FOR UPDATE;
  IF v_counts_down IS NOT TRUE THEN
    -- this report may end the step, and so move or fail the run: claims of the run wait for it
    -- (no task row is held yet, so a claim this waits for never waits for this call)
    PERFORM 1 FROM pgflow.runs AS r WHERE r.run_id = complete_task.run_id FOR UPDATE;
  END IF;
  -- a started task completes; anything else is a report that no longer (or never) counts
  v_task := (pgflow._complete_started_tasks(ARRAY[complete_task.run_id], ARRAY[complete_task.step_slug],
                                            ARRAY[complete_task.task_index], ARRAY[complete_task.output], 'queue'))[1];
  IF v_task.run_id IS NULL THEN
    v_report := pgflow._lock_worker_task('complete_task', complete_task.run_id, complete_task.step_slug,
                                         complete_task.task_index);
    v_task := v_report.task;
    IF v_task.run_id IS NOT NULL THEN
      RETURN NEXT v_task;  -- late: its message is archived unless the task was queued again
    END IF;
    RETURN;
  END IF;
  PERFORM pgflow._archive_task_messages(ARRAY[complete_task.run_id], ARRAY[complete_task.step_slug],
                                        ARRAY[complete_task.task_index]);
  RETURN NEXT v_task;
END;
$$;

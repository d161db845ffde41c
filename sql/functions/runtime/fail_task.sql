-- Records a worker task's failure; error_message says why (NULL is allowed). Late, repeated and
-- unknown reports and manual tasks are handled as complete_task handles them (_lock_worker_task).
-- With attempts left (attempts_count < effective max_attempts) the task is queued again and its
-- message becomes visible after calculate_retry_delay(effective base_delay, attempts_count)
-- seconds. A task whose message no longer exists (a permanently stalled task) cannot be retried and
-- is treated as exhausted. An exhausted task fails for good through _fail_started_task (its step's
-- when_exhausted decides: fail, skip or skip-cascade), then its message is archived. Returns the
-- task row.
CREATE OR REPLACE FUNCTION pgflow.fail_task(run_id uuid, step_slug text, task_index integer, error_message text)
RETURNS SETOF pgflow.step_tasks
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_report record;
  v_task pgflow.step_tasks;
  v_max_attempts integer;
  v_base_delay integer;
  v_error text := fail_task.error_message;
BEGIN
  v_report := pgflow._lock_worker_task('fail_task', fail_task.run_id, fail_task.step_slug, fail_task.task_index);
  v_task := v_report.task;
  IF v_task.run_id IS NULL THEN
    RETURN;
  END IF;
  IF NOT v_report.started THEN
    RETURN NEXT v_task;
    RETURN;
  END IF;

  SELECT coalesce(s.opt_max_attempts, f.opt_max_attempts), coalesce(s.opt_base_delay, f.opt_base_delay)
  INTO v_max_attempts, v_base_delay
  FROM pgflow.steps AS s
  JOIN pgflow.flows AS f ON f.flow_slug = s.flow_slug
  WHERE s.flow_slug = v_task.flow_slug AND s.step_slug = fail_task.step_slug;

  IF v_task.attempts_count < v_max_attempts THEN
    UPDATE pgflow.step_tasks AS t
       SET status = 'queued', started_at = NULL, error_message = v_error
     WHERE t.run_id = fail_task.run_id AND t.step_slug = fail_task.step_slug AND t.task_index = fail_task.task_index
    RETURNING t.* INTO v_task;
    IF pgflow._set_task_messages_vt(ARRAY[v_task.run_id], ARRAY[v_task.step_slug], ARRAY[v_task.task_index],
                                    ARRAY[pgflow.calculate_retry_delay(v_base_delay, v_task.attempts_count)]) > 0 THEN
      RETURN NEXT v_task;
      RETURN;
    END IF;
    v_error := v_error || ' (not retried: the task''s queue message no longer exists)';
  END IF;

  v_task := pgflow._fail_started_task(fail_task.run_id, fail_task.step_slug, fail_task.task_index, v_error, false, NULL);
  PERFORM pgflow._archive_task_messages(ARRAY[v_task.run_id], ARRAY[v_task.step_slug], ARRAY[v_task.task_index]);
  RETURN NEXT v_task;
END;
$$;

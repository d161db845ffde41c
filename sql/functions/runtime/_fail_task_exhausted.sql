-- The progression core of a task's final failure, shared by fail_task (worker, once no attempt is
-- left) and fail_manual_task (a manual task never retries): the caller holds the run row lock, has
-- locked the step state and task, and has checked that run, step and task are started. The task
-- fails with p_error_message and its step's when_exhausted decides:
--   fail         -> the step and the run fail; every other unfinished task is cancelled
--   skip         -> the step is skipped (handler_failed), its other tasks skipped, children released
--   skip-cascade -> the step and everything below it are skipped
-- and the run moves on (_advance_run). Messages of other tasks this cancels or skips are archived
-- by _fail_run/_skip_step/_cascade_force_skip_steps; the failing task's own message is the
-- wrapper's business (a manual task has none).
CREATE OR REPLACE FUNCTION pgflow._fail_task_exhausted(p_run_id uuid, p_step_slug text, p_task_index integer, p_error_message text)
RETURNS pgflow.step_tasks
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_task pgflow.step_tasks;
  v_when_exhausted text;
BEGIN
  SELECT s.when_exhausted INTO v_when_exhausted
  FROM pgflow.runs AS r
  JOIN pgflow.steps AS s ON s.flow_slug = r.flow_slug AND s.step_slug = p_step_slug
  WHERE r.run_id = p_run_id;

  UPDATE pgflow.step_tasks AS t
     SET status = 'failed', failed_at = GREATEST(pg_catalog.now(), t.started_at), error_message = p_error_message
   WHERE t.run_id = p_run_id AND t.step_slug = p_step_slug AND t.task_index = p_task_index
  RETURNING t.* INTO v_task;

  IF v_when_exhausted = 'fail' THEN
    PERFORM pgflow._fail_run(p_run_id, p_step_slug, p_error_message);
  ELSE
    IF v_when_exhausted = 'skip' THEN
      PERFORM pgflow._skip_step(p_run_id, p_step_slug, 'handler_failed', p_error_message);
    ELSE
      PERFORM pgflow._cascade_force_skip_steps(p_run_id, p_step_slug, 'handler_failed');
      UPDATE pgflow.step_states AS ss SET error_message = p_error_message
       WHERE ss.run_id = p_run_id AND ss.step_slug = p_step_slug;
    END IF;
    PERFORM pgflow._advance_run(p_run_id);
  END IF;
  RETURN v_task;
END;
$$;
REVOKE ALL ON FUNCTION pgflow._fail_task_exhausted(uuid, text, integer, text) FROM PUBLIC;

-- The one way a started task fails for good, whoever reports it: fail_task once no attempt is
-- left, fail_manual_task (a manual task never retries) and a completion whose output breaks the
-- type rule (_complete_started_tasks: a single step's non-array output feeding a map step). The
-- caller holds the run row lock FOR UPDATE, has locked the step state and the task, and has checked
-- that run, step and task are started.
-- The task fails with p_error_message; it ends no earlier than it started (a report that waited
-- behind a newer claim of its task ends it no earlier than that claim). Then:
--   p_type_violation   the task keeps the output it was given (p_output), for diagnosis, and the
--                      run fails: no later step can use that output, whatever when_exhausted says;
--   otherwise          the step's when_exhausted decides:
--     fail             the step and the run fail; every other unfinished task is cancelled
--     skip             the step is skipped (handler_failed), its other tasks skipped, children released
--     skip-cascade     the step and everything below it are skipped
--                      and the run moves on (_advance_run).
-- Messages of other tasks this cancels or skips are archived by _fail_run, _skip_step and
-- _cascade_force_skip_steps; the failing task's own message is its caller's (a manual task has
-- none). Returns the failed task row.
CREATE OR REPLACE FUNCTION pgflow._fail_started_task(p_run_id uuid, p_step_slug text, p_task_index integer,
                                                     p_error_message text, p_type_violation boolean, p_output jsonb)
RETURNS pgflow.step_tasks
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_task pgflow.step_tasks;
  v_when_exhausted text := 'fail';
BEGIN
  IF NOT p_type_violation THEN
    SELECT s.when_exhausted INTO v_when_exhausted
    FROM pgflow.runs AS r
    JOIN pgflow.steps AS s ON s.flow_slug = r.flow_slug AND s.step_slug = p_step_slug
    WHERE r.run_id = p_run_id;
  END IF;

  UPDATE pgflow.step_tasks AS t
     SET status = 'failed', failed_at = GREATEST(pg_catalog.now(), t.started_at), error_message = p_error_message,
         output = CASE WHEN p_type_violation THEN p_output ELSE t.output END
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
REVOKE ALL ON FUNCTION pgflow._fail_started_task(uuid, text, integer, text, boolean, jsonb) FROM PUBLIC;

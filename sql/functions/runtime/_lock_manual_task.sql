-- Locks and validates one manual task for complete_manual_task / fail_manual_task, in the
-- runtime's lock order: the runs row FOR UPDATE (serialises every change of the run with worker
-- completions, failures and claims), then the step state, then the task. p_outcome is what the
-- caller wants to record: 'completed' with p_output, or 'failed' with p_error_message.
-- Returns the task row:
--   status 'started' (run and step started too): the caller records the outcome now;
--   a terminal row that equals the request (completed with an equal JSON output, failed with the
--   same error, or a [TYPE_VIOLATION] failure that kept this very output): a repeated call, the
--   caller returns it without progressing again.
-- Raises (docs/manual-tasks.md "Errors"):
--   PF009 manual_task_not_found   no such run, or no task at that step and index (yet);
--   PF010 manual_task_not_manual  the task is queue-backed (its execution_mode snapshot);
--   PF012 manual_task_conflict    the task already has another outcome or another output/error;
--   PF011 manual_task_not_active  the task, its step or its run is no longer started (skipped,
--                                 cancelled, or the run finished without this task).
-- Messages name the task address, never outputs.
CREATE OR REPLACE FUNCTION pgflow._lock_manual_task(
  p_function text,
  p_run_id uuid,
  p_step_slug text,
  p_task_index integer,
  p_outcome text,
  p_output jsonb,
  p_error_message text
)
RETURNS pgflow.step_tasks
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_run pgflow.runs;
  v_state pgflow.step_states;
  v_task pgflow.step_tasks;
  v_address text := pg_catalog.format('run %s, step "%s", task index %s',
                                      coalesce(p_run_id::text, 'NULL'), coalesce(p_step_slug, 'NULL'),
                                      coalesce(p_task_index::text, 'NULL'));
BEGIN
  SELECT r.* INTO v_run FROM pgflow.runs AS r WHERE r.run_id = p_run_id FOR UPDATE;
  IF v_run.run_id IS NULL THEN
    RAISE EXCEPTION '%(): no manual task at %: the run does not exist', p_function, v_address
      USING ERRCODE = 'PF009', HINT = 'check the run id (pgflow task list shows waiting manual tasks)';
  END IF;
  SELECT ss.* INTO v_state FROM pgflow.step_states AS ss
  WHERE ss.run_id = p_run_id AND ss.step_slug = p_step_slug FOR UPDATE;
  SELECT t.* INTO v_task FROM pgflow.step_tasks AS t
  WHERE t.run_id = p_run_id AND t.step_slug = p_step_slug AND t.task_index = p_task_index FOR UPDATE;
  IF v_task.run_id IS NULL THEN
    RAISE EXCEPTION '%(): no manual task at %: %', p_function, v_address,
      CASE WHEN v_state.run_id IS NULL THEN pg_catalog.format('flow "%s" has no such step', v_run.flow_slug)
           WHEN v_state.status = 'created' THEN 'the step has not started yet'
           ELSE pg_catalog.format('the step (%s) has no task with that index', v_state.status) END
      USING ERRCODE = 'PF009',
            HINT = 'a manual task exists once its step is ready; task indexes of a map step run 0 .. items - 1';
  END IF;
  IF v_task.execution_mode IS DISTINCT FROM 'manual' THEN
    RAISE EXCEPTION '%(): the task at % is queue-backed, not manual', p_function, v_address
      USING ERRCODE = 'PF010', HINT = 'its worker reports it with pgflow.complete_task() / pgflow.fail_task()';
  END IF;

  IF v_task.status = 'completed' OR v_task.status = 'failed' THEN
    IF (p_outcome = 'completed' AND v_task.status = 'completed' AND v_task.output = p_output)
       OR (p_outcome = 'failed' AND v_task.status = 'failed' AND v_task.error_message = p_error_message)
       OR (p_outcome = 'completed' AND v_task.status = 'failed' AND v_task.output = p_output) THEN
      RETURN v_task;
    END IF;
    RAISE EXCEPTION '%(): the task at % is already %', p_function, v_address,
      CASE WHEN v_task.status = p_outcome AND p_outcome = 'completed' THEN 'completed with a different output'
           WHEN v_task.status = p_outcome THEN 'failed with a different error message'
           ELSE v_task.status END
      USING ERRCODE = 'PF012',
            HINT = 'a manual task records one outcome; repeating exactly the same call returns the stored task';
  END IF;

  IF v_task.status <> 'started' OR v_run.status <> 'started' OR v_state.status <> 'started' THEN
    RAISE EXCEPTION '%(): the task at % is no longer active (task %, step %, run %)', p_function, v_address,
      v_task.status, v_state.status, v_run.status
      USING ERRCODE = 'PF011', HINT = 'nothing was changed; a finished run is never revived';
  END IF;
  RETURN v_task;
END;
$$;
REVOKE ALL ON FUNCTION pgflow._lock_manual_task(text, uuid, text, integer, text, jsonb, text) FROM PUBLIC;

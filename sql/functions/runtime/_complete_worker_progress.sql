-- The progression of a worker task's success (0013), called by complete_task and
-- _complete_worker_task (complete_tasks) with the run row locked (FOR UPDATE), the step state
-- and task locked, and run, step and task checked started. The same outcome as the shared core
-- _complete_task_progress (which manual completion keeps using), in fewer statements:
--   * a single step whose output is not an array but feeds a map step goes to
--     _complete_task_progress, which fails the run with the [TYPE_VIOLATION] error;
--   * the task completes; the step's remaining_tasks drops and, when it reaches 0, the step
--     completes (map output: task outputs in task_index order) in the same UPDATE: one new row
--     version per step state and call, so the step state's foreign keys are not checked again
--     (PostgreSQL re-checks them on every further update of a row the transaction changed);
--   * the children are released, the run's remaining_steps drops, the step:completed event is
--     built only when realtime.send exists, and the run moves on (_advance_run).
-- Returns the task row. No PGMQ call: the caller archives the task's message.
CREATE OR REPLACE FUNCTION pgflow._complete_worker_progress(p_run_id uuid, p_step_slug text, p_task_index integer,
                                                            p_output jsonb)
RETURNS pgflow.step_tasks
LANGUAGE plpgsql VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_flow text;
  v_type text;
  v_task pgflow.step_tasks;
  v_state pgflow.step_states;
  v_child_tasks integer;
BEGIN
  SELECT r.flow_slug, s.step_type INTO v_flow, v_type
  FROM pgflow.runs AS r
  JOIN pgflow.steps AS s ON s.flow_slug = r.flow_slug AND s.step_slug = p_step_slug
  WHERE r.run_id = p_run_id;

  IF v_type = 'single'
     AND pg_catalog.jsonb_typeof(p_output) IS DISTINCT FROM 'array'
     AND EXISTS (SELECT 1 FROM pgflow.deps AS d
                 JOIN pgflow.steps AS c ON c.flow_slug = d.flow_slug AND c.step_slug = d.step_slug
                 WHERE d.flow_slug = v_flow AND d.dep_slug = p_step_slug AND c.step_type = 'map') THEN
    RETURN pgflow._complete_task_progress(p_run_id, p_step_slug, p_task_index, p_output);
  END IF;

  --@include functions/runtime/parts/task_completed.sql

  UPDATE pgflow.step_states AS ss
     SET remaining_tasks = ss.remaining_tasks - 1,
         status = CASE WHEN ss.remaining_tasks = 1 THEN 'completed' ELSE ss.status END,
         completed_at = CASE WHEN ss.remaining_tasks = 1 THEN pg_catalog.now() ELSE ss.completed_at END,
         output = CASE WHEN ss.remaining_tasks <> 1 THEN ss.output
                       WHEN v_type = 'map' THEN
                           --@include functions/runtime/parts/map_step_output.sql
                       ELSE p_output END
   WHERE ss.run_id = p_run_id AND ss.step_slug = p_step_slug
  RETURNING ss.* INTO v_state;
  IF v_state.remaining_tasks IS DISTINCT FROM 0 THEN
    RETURN v_task;
  END IF;

  -- map children learn their size, dependents lose a dependency, the run a step (the lines
  -- _complete_task_progress runs at the same point)
  --@include functions/runtime/parts/step_completed_release.sql

  IF pg_catalog.to_regprocedure('realtime.send(jsonb,text,text,boolean)') IS NOT NULL THEN
    PERFORM pgflow._broadcast_step(v_state);
  END IF;
  PERFORM pgflow._advance_run(p_run_id);
  RETURN v_task;
END;
$$;
REVOKE ALL ON FUNCTION pgflow._complete_worker_progress(uuid, text, integer, jsonb) FROM PUBLIC;

-- The progression core of a task's success, shared by complete_task (worker) and
-- complete_manual_task: the caller holds the run row lock (FOR UPDATE), has locked the step state
-- and task, and has checked that run, step and task are started. The task completes; when it was
-- the step's last one the step completes (map output: task outputs in task_index order), the
-- children are released, and the run moves on (_advance_run: conditions, taskless cascades, ready
-- steps, run completion). A single step whose output is not an array but feeds a map step fails
-- the run with a [TYPE_VIOLATION] error; the failed task keeps that output. No PGMQ call of its
-- own for this task: the queue-backed wrapper archives the task's message afterwards.
CREATE OR REPLACE FUNCTION pgflow._complete_task_progress(p_run_id uuid, p_step_slug text, p_task_index integer, p_output jsonb)
RETURNS pgflow.step_tasks
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_flow text;
  v_task pgflow.step_tasks;
  v_state pgflow.step_states;
  v_step pgflow.steps;
  v_error text;
  v_child_tasks integer;
BEGIN
  SELECT r.flow_slug INTO v_flow FROM pgflow.runs AS r WHERE r.run_id = p_run_id;
  SELECT s.* INTO v_step FROM pgflow.steps AS s
  WHERE s.flow_slug = v_flow AND s.step_slug = p_step_slug;

  -- A map step over a single step's output needs an array.
  IF v_step.step_type = 'single'
     AND pg_catalog.jsonb_typeof(p_output) IS DISTINCT FROM 'array'
     AND EXISTS (SELECT 1 FROM pgflow.deps AS d
                 JOIN pgflow.steps AS c ON c.flow_slug = d.flow_slug AND c.step_slug = d.step_slug
                 WHERE d.flow_slug = v_flow AND d.dep_slug = p_step_slug AND c.step_type = 'map') THEN
    SELECT pg_catalog.format('[TYPE_VIOLATION] step "%s" returned %s, but map step(s) %s need a JSON array from it',
                             p_step_slug,
                             coalesce(pg_catalog.jsonb_typeof(p_output), 'no output'),
                             pg_catalog.string_agg('"' || d.step_slug || '"', ', ' ORDER BY d.step_slug))
    INTO v_error
    FROM pgflow.deps AS d
    JOIN pgflow.steps AS c ON c.flow_slug = d.flow_slug AND c.step_slug = d.step_slug
    WHERE d.flow_slug = v_flow AND d.dep_slug = p_step_slug AND c.step_type = 'map';

    -- the failed task keeps the offending output, for diagnosis (docs/compatibility.md item 4)
    UPDATE pgflow.step_tasks AS t
       SET status = 'failed', failed_at = GREATEST(pg_catalog.now(), t.started_at), error_message = v_error, output = p_output
     WHERE t.run_id = p_run_id AND t.step_slug = p_step_slug AND t.task_index = p_task_index
    RETURNING t.* INTO v_task;
    PERFORM pgflow._fail_run(p_run_id, p_step_slug, v_error);
    RETURN v_task;
  END IF;

  --@include functions/runtime/parts/task_completed.sql

  UPDATE pgflow.step_states AS ss
     SET remaining_tasks = ss.remaining_tasks - 1
   WHERE ss.run_id = p_run_id AND ss.step_slug = p_step_slug
  RETURNING ss.* INTO v_state;

  IF v_state.remaining_tasks = 0 THEN
    UPDATE pgflow.step_states AS ss
       SET status = 'completed',
           completed_at = pg_catalog.now(),
           output = CASE WHEN v_step.step_type = 'map' THEN
                           --@include functions/runtime/parts/map_step_output.sql
                         ELSE p_output END
     WHERE ss.run_id = p_run_id AND ss.step_slug = p_step_slug
    RETURNING ss.* INTO v_state;

    -- Size of a map child that maps over this step's output (computed here: a CASE inside the
    -- UPDATE could be folded at plan time and evaluated for non-arrays).
    --@include functions/runtime/parts/step_completed_release.sql

    PERFORM pgflow._broadcast_step(v_state);
    PERFORM pgflow._advance_run(p_run_id);
  END IF;

  RETURN v_task;
END;
$$;
REVOKE ALL ON FUNCTION pgflow._complete_task_progress(uuid, text, integer, jsonb) FROM PUBLIC;

-- Records a task's success. A late call (run or step no longer started, task terminal) changes
-- nothing and archives the task's message idempotently; a queued task (requeued by stalled
-- recovery) is left alone with its message. Otherwise the task completes; when it was the
-- step's last one the step completes (map output: task outputs in task_index order), the
-- children are released, and the run moves on. A single step whose output is not an array but
-- feeds a map step fails the run with a [TYPE_VIOLATION] error; the failed task keeps that output.
CREATE OR REPLACE FUNCTION pgflow.complete_task(run_id uuid, step_slug text, task_index integer, output jsonb)
--@include functions/runtime/parts/task_call_header.sql
  v_step pgflow.steps;
  v_error text;
  v_child_tasks integer;
BEGIN
  --@include functions/runtime/parts/lock_and_load_task.sql fn=complete_task

  SELECT s.* INTO v_step FROM pgflow.steps AS s
  WHERE s.flow_slug = v_run.flow_slug AND s.step_slug = complete_task.step_slug;

  -- A map step over a single step's output needs an array.
  IF v_step.step_type = 'single'
     AND pg_catalog.jsonb_typeof(complete_task.output) IS DISTINCT FROM 'array'
     AND EXISTS (SELECT 1 FROM pgflow.deps AS d
                 JOIN pgflow.steps AS c ON c.flow_slug = d.flow_slug AND c.step_slug = d.step_slug
                 WHERE d.flow_slug = v_run.flow_slug AND d.dep_slug = complete_task.step_slug AND c.step_type = 'map') THEN
    SELECT pg_catalog.format('[TYPE_VIOLATION] step "%s" returned %s, but map step(s) %s need a JSON array from it',
                             complete_task.step_slug,
                             coalesce(pg_catalog.jsonb_typeof(complete_task.output), 'no output'),
                             pg_catalog.string_agg('"' || d.step_slug || '"', ', ' ORDER BY d.step_slug))
    INTO v_error
    FROM pgflow.deps AS d
    JOIN pgflow.steps AS c ON c.flow_slug = d.flow_slug AND c.step_slug = d.step_slug
    WHERE d.flow_slug = v_run.flow_slug AND d.dep_slug = complete_task.step_slug AND c.step_type = 'map';

    -- the failed task keeps the offending output, for diagnosis (docs/compatibility.md item 4)
    UPDATE pgflow.step_tasks AS t
       SET status = 'failed', failed_at = pg_catalog.now(), error_message = v_error, output = complete_task.output
     WHERE t.run_id = complete_task.run_id AND t.step_slug = complete_task.step_slug
       AND t.task_index = complete_task.task_index
    RETURNING t.* INTO v_task;
    PERFORM pgflow._fail_run(complete_task.run_id, complete_task.step_slug, v_error);
    RETURN NEXT v_task;
    RETURN;
  END IF;

  UPDATE pgflow.step_tasks AS t
     SET status = 'completed', completed_at = pg_catalog.now(), output = complete_task.output
   WHERE t.run_id = complete_task.run_id AND t.step_slug = complete_task.step_slug
     AND t.task_index = complete_task.task_index
  RETURNING t.* INTO v_task;

  UPDATE pgflow.step_states AS ss
     SET remaining_tasks = ss.remaining_tasks - 1
   WHERE ss.run_id = complete_task.run_id AND ss.step_slug = complete_task.step_slug
  RETURNING ss.* INTO v_state;

  IF v_state.remaining_tasks = 0 THEN
    UPDATE pgflow.step_states AS ss
       SET status = 'completed',
           completed_at = pg_catalog.now(),
           output = CASE WHEN v_step.step_type = 'map' THEN coalesce((
                           SELECT pg_catalog.jsonb_agg(t.output ORDER BY t.task_index)
                           FROM pgflow.step_tasks AS t
                           WHERE t.run_id = ss.run_id AND t.step_slug = ss.step_slug AND t.status = 'completed'),
                           '[]'::jsonb)
                         ELSE complete_task.output END
     WHERE ss.run_id = complete_task.run_id AND ss.step_slug = complete_task.step_slug
    RETURNING ss.* INTO v_state;

    -- Size of a map child that maps over this step's output (computed here: a CASE inside the
    -- UPDATE could be folded at plan time and evaluated for non-arrays).
    IF pg_catalog.jsonb_typeof(v_state.output) = 'array' THEN
      v_child_tasks := pg_catalog.jsonb_array_length(v_state.output);
    END IF;

    UPDATE pgflow.step_states AS cs
       SET remaining_deps = cs.remaining_deps - 1,
           initial_tasks = CASE
             WHEN c.step_type = 'map' AND cs.initial_tasks IS NULL THEN v_child_tasks
             ELSE cs.initial_tasks END
      FROM pgflow.deps AS d
      JOIN pgflow.steps AS c ON c.flow_slug = d.flow_slug AND c.step_slug = d.step_slug
     WHERE d.flow_slug = v_run.flow_slug AND d.dep_slug = complete_task.step_slug
       AND cs.run_id = complete_task.run_id AND cs.step_slug = d.step_slug AND cs.status = 'created';

    UPDATE pgflow.runs AS r SET remaining_steps = r.remaining_steps - 1 WHERE r.run_id = complete_task.run_id;

    PERFORM pgflow._broadcast_step(v_state);
    PERFORM pgflow._advance_run(complete_task.run_id);
  END IF;

  PERFORM pgflow._archive_task_messages(ARRAY[v_task.run_id], ARRAY[v_task.step_slug], ARRAY[v_task.task_index]);
  RETURN NEXT v_task;
END;
$$;

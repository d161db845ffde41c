-- The set-based path of complete_tasks (0014): applies a whole batch of worker completions with
-- one statement per table instead of a chain of calls per element, when that gives exactly what
-- one complete_task per element, in array order, gives. The caller (complete_tasks) has checked
-- the elements and locked their runs FOR UPDATE; the arrays are the batch in array order.
-- It applies the batch only when
--   * every element names a different run (so no element can see another's effects: each run
--     gets one task update, one step-state update, its children released once, and moves on
--     once, in array order, so messages are sent in the order the element path sends them);
--   * every element's run, step and task are started, the task is queue-backed (not manual),
--     and the step cannot raise a [TYPE_VIOLATION] (a single step with a non-array output that
--     feeds a map step);
--   * realtime.send does not exist (the element path's events interleave per element).
-- Then, under the same locks the element path takes (step state, then task, FOR UPDATE, per
-- element in array order; the rows are then addressed by their locked ctid, so no statement
-- depends on the planner's estimates): tasks completed, step states decremented and completed
-- in one UPDATE (map output in task_index order), children released, remaining_steps of the runs
-- whose step completed decremented, and those runs moved on as _advance_run moves each in array
-- order (together when their flows have no condition and no map step, below). Returns true when
-- it applied the batch; false when it applied nothing (the caller then applies the elements one
-- by one). Its only PGMQ call is the send of the runs started together; the caller archives.
CREATE OR REPLACE FUNCTION pgflow._complete_worker_tasks(p_run_ids uuid[], p_step_slugs text[], p_task_indexes integer[],
                                                         p_outputs jsonb[])
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_ok boolean;
  v_state_tids tid[];
  v_task_tids tid[];
  v_types text[];
  v_flows text[];
  v_done_runs uuid[];
  v_cascades boolean;
  v_finished uuid[];
  v_going uuid[];
BEGIN
  IF pg_catalog.to_regprocedure('realtime.send(jsonb,text,text,boolean)') IS NOT NULL
     OR (SELECT pg_catalog.count(DISTINCT u.run_id) FROM pg_catalog.unnest(p_run_ids) AS u (run_id))
        <> pg_catalog.cardinality(p_run_ids) THEN
    RETURN false;
  END IF;

  SELECT pg_catalog.bool_and(coalesce(
           r.status = 'started' AND ss.status = 'started' AND t.status = 'started' AND t.execution_mode = 'queue'
           AND NOT (s.step_type = 'single' AND pg_catalog.jsonb_typeof(k.output) IS DISTINCT FROM 'array'
                    AND EXISTS (SELECT 1 FROM pgflow.deps AS d
                                JOIN pgflow.steps AS c ON c.flow_slug = d.flow_slug AND c.step_slug = d.step_slug
                                WHERE d.flow_slug = s.flow_slug AND d.dep_slug = s.step_slug AND c.step_type = 'map')),
           false)),
         pg_catalog.array_agg(ss.ctid ORDER BY k.n),
         pg_catalog.array_agg(t.ctid ORDER BY k.n),
         pg_catalog.array_agg(s.step_type ORDER BY k.n),
         pg_catalog.array_agg(r.flow_slug ORDER BY k.n)
  INTO v_ok, v_state_tids, v_task_tids, v_types, v_flows
  FROM ROWS FROM (pg_catalog.unnest(p_run_ids), pg_catalog.unnest(p_step_slugs), pg_catalog.unnest(p_task_indexes),
                  pg_catalog.unnest(p_outputs)) WITH ORDINALITY AS k (run_id, step_slug, task_index, output, n)
  -- one primary-key probe per element (LIMIT 1 keeps the planner from a join over the tables)
  LEFT JOIN LATERAL (SELECT x.status, x.flow_slug FROM pgflow.runs AS x WHERE x.run_id = k.run_id LIMIT 1) AS r ON true
  LEFT JOIN LATERAL (SELECT y.ctid, y.status FROM pgflow.step_states AS y
                     WHERE y.run_id = k.run_id AND y.step_slug = k.step_slug LIMIT 1 FOR UPDATE) AS ss ON true
  LEFT JOIN LATERAL (SELECT z.ctid, z.status, z.execution_mode FROM pgflow.step_tasks AS z
                     WHERE z.run_id = k.run_id AND z.step_slug = k.step_slug AND z.task_index = k.task_index
                     LIMIT 1 FOR UPDATE) AS t ON true
  LEFT JOIN LATERAL (SELECT w.flow_slug, w.step_slug, w.step_type FROM pgflow.steps AS w
                     WHERE w.flow_slug = r.flow_slug AND w.step_slug = k.step_slug LIMIT 1) AS s ON true;
  IF v_ok IS NOT TRUE THEN
    RETURN false;
  END IF;

  UPDATE pgflow.step_tasks AS t
     SET status = 'completed', completed_at = GREATEST(pg_catalog.now(), t.started_at), output = u.output
    FROM ROWS FROM (pg_catalog.unnest(v_task_tids), pg_catalog.unnest(p_outputs)) AS u (tid, output)
   WHERE t.ctid = u.tid;

  WITH done AS (
    UPDATE pgflow.step_states AS ss
       SET remaining_tasks = ss.remaining_tasks - 1,
           status = CASE WHEN ss.remaining_tasks = 1 THEN 'completed' ELSE ss.status END,
           completed_at = CASE WHEN ss.remaining_tasks = 1 THEN pg_catalog.now() ELSE ss.completed_at END,
           output = CASE WHEN ss.remaining_tasks <> 1 THEN ss.output
                         WHEN u.step_type = 'map' THEN
                           --@include functions/runtime/parts/map_step_output.sql
                         ELSE u.output END
      FROM ROWS FROM (pg_catalog.unnest(v_state_tids), pg_catalog.unnest(p_outputs), pg_catalog.unnest(v_types),
                      pg_catalog.unnest(v_flows)) WITH ORDINALITY AS u (tid, output, step_type, flow_slug, n)
     WHERE ss.ctid = u.tid
    RETURNING ss.run_id, ss.step_slug, ss.remaining_tasks, ss.output, u.flow_slug, u.n
  ), released AS (
    -- the children of every step that completed (each run has one element, so one release per child)
    UPDATE pgflow.step_states AS cs
       SET remaining_deps = cs.remaining_deps - 1,
           initial_tasks = CASE
             WHEN c.step_type = 'map' AND cs.initial_tasks IS NULL
               THEN CASE WHEN pg_catalog.jsonb_typeof(done.output) = 'array' THEN pg_catalog.jsonb_array_length(done.output) END
             ELSE cs.initial_tasks END
      FROM done
      JOIN pgflow.deps AS d ON d.flow_slug = done.flow_slug AND d.dep_slug = done.step_slug
      JOIN pgflow.steps AS c ON c.flow_slug = d.flow_slug AND c.step_slug = d.step_slug
     WHERE done.remaining_tasks = 0
       AND cs.run_id = done.run_id AND cs.step_slug = d.step_slug AND cs.status = 'created'
  )  -- (a data-modifying WITH runs to completion whether or not the query reads it)
  SELECT pg_catalog.array_agg(done.run_id ORDER BY done.n) INTO v_done_runs
  FROM done
  WHERE done.remaining_tasks = 0;

  IF v_done_runs IS NULL THEN
    RETURN true;
  END IF;
  UPDATE pgflow.runs AS r SET remaining_steps = r.remaining_steps - 1 WHERE r.run_id = ANY (v_done_runs);

  -- Moving the runs on. When no flow of them has a condition or a map step, _advance_run would
  -- only complete the runs with no step left and start the others' ready steps: the runs that
  -- go on start together (_start_ready_steps_of_runs: one UPDATE, one send, one INSERT) when
  -- their steps share a queue and a start delay. Otherwise each run moves on by itself, in array order.
  SELECT pg_catalog.bool_or(s.required_input_pattern IS NOT NULL OR s.forbidden_input_pattern IS NOT NULL
                            OR s.step_type = 'map'),
         pg_catalog.array_agg(DISTINCT d.run_id) FILTER (WHERE d.remaining_steps = 0)
  INTO v_cascades, v_finished
  FROM (SELECT r.run_id, r.flow_slug, r.remaining_steps
        FROM pgflow.runs AS r WHERE r.run_id = ANY (v_done_runs)) AS d
  JOIN pgflow.steps AS s ON s.flow_slug = d.flow_slug;
  IF v_cascades THEN
    FOR v_i IN 1 .. pg_catalog.cardinality(v_done_runs) LOOP
      PERFORM pgflow._advance_run(v_done_runs[v_i]);
    END LOOP;
    RETURN true;
  END IF;
  -- (a run completing sends nothing, so completing them first keeps the message order)
  SELECT pg_catalog.array_agg(u.run_id ORDER BY u.n) FILTER (WHERE u.run_id = ANY (coalesce(v_finished, '{}'))),
         pg_catalog.array_agg(u.run_id ORDER BY u.n) FILTER (WHERE u.run_id <> ALL (coalesce(v_finished, '{}')))
  INTO v_finished, v_going
  FROM ROWS FROM (pg_catalog.unnest(v_done_runs)) WITH ORDINALITY AS u (run_id, n);
  FOR v_i IN 1 .. coalesce(pg_catalog.cardinality(v_finished), 0) LOOP
    PERFORM pgflow.maybe_complete_run(v_finished[v_i]);
  END LOOP;
  IF v_going IS NOT NULL AND NOT pgflow._start_ready_steps_of_runs(v_going) THEN
    FOR v_i IN 1 .. pg_catalog.cardinality(v_going) LOOP
      PERFORM pgflow.start_ready_steps(v_going[v_i]);
    END LOOP;
  END IF;
  RETURN true;
END;
$$;
REVOKE ALL ON FUNCTION pgflow._complete_worker_tasks(uuid[], text[], integer[], jsonb[]) FROM PUBLIC;

-- The one way started tasks complete, whoever reports them: complete_task and complete_manual_task
-- with one element, complete_tasks with a whole batch of independent completions (one statement per
-- table instead of a chain of calls per element), and each element of a batch it cannot take.
-- The arrays are the elements in order; p_execution_mode is the mode the entry point reports
-- ('queue': a worker's report, 'manual': trusted code's). The caller holds every element's run row
-- lock FOR UPDATE; the step states and tasks are locked by _write_task_completions.
-- It applies the elements only when that gives exactly what one call per element, in array order,
-- gives: every element names a different run (no element can see another's effects); every
-- element's run, step and task are started and the task has p_execution_mode; and with several
-- elements, none can raise a [TYPE_VIOLATION] and realtime.send does not exist (a call per element
-- fails its run, or sends its events, between the other elements). Otherwise it changes nothing and
-- returns NULL; complete_tasks then goes element by element.
-- Applying:
--   * a single step whose output is not an array but feeds a map step fails its task and run
--     through _fail_started_task with a [TYPE_VIOLATION] error (no later step could use it);
--   * every other task completes and its step counts down or completes, children released
--     (_write_task_completions);
--   * the step:completed event goes out when realtime.send exists, and each run whose step
--     completed moves on as _advance_run moves it. When several runs move on and no flow of them
--     has a condition or a map step (no cascade can run), the runs with no step left complete and
--     the others start their ready steps together (_start_ready_steps_of_runs: one UPDATE, one
--     send, one INSERT) when their steps share a queue and a start delay.
-- Returns the task rows in array order. Its only PGMQ calls are those of the runs moving on and of
-- a failed run; the caller archives the reported tasks' messages (a manual task has none).
CREATE OR REPLACE FUNCTION pgflow._complete_started_tasks(p_run_ids uuid[], p_step_slugs text[], p_task_indexes integer[],
                                                          p_outputs jsonb[], p_execution_mode text)
RETURNS pgflow.step_tasks[]
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_realtime boolean := pg_catalog.to_regprocedure('realtime.send(jsonb,text,text,boolean)') IS NOT NULL;
  v_written record;
  v_done pgflow.step_states[];
  v_done_runs uuid[];
  v_cascades boolean;
  v_finished uuid[];
  v_going uuid[];
BEGIN
  IF pg_catalog.cardinality(p_run_ids) > 1
     AND (v_realtime OR (SELECT pg_catalog.count(DISTINCT u.run_id) FROM pg_catalog.unnest(p_run_ids) AS u (run_id))
                        <> pg_catalog.cardinality(p_run_ids)) THEN
    RETURN NULL;
  END IF;

  v_written := pgflow._write_task_completions(p_run_ids, p_step_slugs, p_task_indexes, p_outputs, p_execution_mode);
  IF v_written.type_violation IS NOT NULL THEN
    RETURN ARRAY[pgflow._fail_started_task(p_run_ids[1], p_step_slugs[1], p_task_indexes[1], v_written.type_violation,
                                           true, p_outputs[1])];
  END IF;
  IF v_written.tasks IS NULL THEN
    RETURN NULL;
  END IF;
  v_done := v_written.completed_steps;
  IF v_done IS NULL THEN
    RETURN v_written.tasks;
  END IF;
  -- Moving the runs on. One run (and every run where realtime.send exists, which is then the only
  -- one) goes through _advance_run after its step's event.
  IF v_realtime OR pg_catalog.cardinality(v_done) = 1 THEN
    FOR v_i IN 1 .. pg_catalog.cardinality(v_done) LOOP
      IF v_realtime THEN
        PERFORM pgflow._broadcast_step(v_done[v_i]);
      END IF;
      PERFORM pgflow._advance_run((v_done[v_i]).run_id);
    END LOOP;
    RETURN v_written.tasks;
  END IF;
  -- Several: when a flow of them has a condition or a map step, each run moves on by itself, in
  -- array order. Otherwise _advance_run would only complete the runs with no step left and start the
  -- others' ready steps, which can start together.
  SELECT pg_catalog.array_agg(d.run_id ORDER BY d.ordinality) INTO v_done_runs
  FROM pg_catalog.unnest(v_done) WITH ORDINALITY AS d;
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
    RETURN v_written.tasks;
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
  RETURN v_written.tasks;
END;
$$;
REVOKE ALL ON FUNCTION pgflow._complete_started_tasks(uuid[], text[], integer[], jsonb[], text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgflow.start_ready_steps(run_id uuid)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_flow text;
  v_started text[];
  v_step text;
  v_tasks integer;
  v_delay integer;
  v_queue text;
  v_mode text;
  v_state pgflow.step_states;
  v_realtime boolean := pg_catalog.to_regprocedure('realtime.send(jsonb,text,text,boolean)') IS NOT NULL;
BEGIN
  SELECT r.flow_slug INTO v_flow FROM pgflow.runs AS r
  WHERE r.run_id = start_ready_steps.run_id AND r.status = 'started';
  IF v_flow IS NULL THEN
    RETURN;
  END IF;

  -- One UPDATE: every caller holds the run row lock (or created the run), so the ready
  -- steps need no separate ordered lock first.
  WITH started AS (
    UPDATE pgflow.step_states AS ss
       SET status = 'started', started_at = pg_catalog.now(), remaining_tasks = ss.initial_tasks
     WHERE ss.run_id = start_ready_steps.run_id
       AND ss.status = 'created' AND ss.remaining_deps = 0 AND ss.initial_tasks > 0
    RETURNING ss.step_slug
  )
  SELECT pg_catalog.array_agg(s.step_slug ORDER BY s.step_slug) INTO v_started FROM started AS s;

  IF v_started IS NULL THEN
    RETURN;
  END IF;

  FOREACH v_step IN ARRAY v_started LOOP
    SELECT ss.initial_tasks, coalesce(s.opt_start_delay, 0), s.queue_name, s.execution_mode
    INTO v_tasks, v_delay, v_queue, v_mode
    FROM pgflow.step_states AS ss
    JOIN pgflow.steps AS s ON s.flow_slug = ss.flow_slug AND s.step_slug = ss.step_slug
    WHERE ss.run_id = start_ready_steps.run_id AND ss.step_slug = v_step;
    IF v_mode = 'manual' THEN
      -- no queue, no message (docs/manual-tasks.md)
      PERFORM pgflow._start_manual_tasks(start_ready_steps.run_id, v_step);
      CONTINUE;
    END IF;

    INSERT INTO pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id)
    SELECT v_flow, start_ready_steps.run_id, v_step, (m.n - 1)::integer, v_queue, m.msg_id
    FROM pgmq.send_batch(
           v_queue,
           ARRAY(SELECT pg_catalog.jsonb_build_object('flow_slug', v_flow,
                                                      'run_id', start_ready_steps.run_id,
                                                      'step_slug', v_step,
                                                      'task_index', g.i)
                 FROM pg_catalog.generate_series(0, v_tasks - 1) AS g (i)
                 ORDER BY g.i),
           v_delay) WITH ORDINALITY AS m (msg_id, n);

    IF v_realtime THEN
      SELECT ss.* INTO v_state FROM pgflow.step_states AS ss
      WHERE ss.run_id = start_ready_steps.run_id AND ss.step_slug = v_step;
      PERFORM pgflow._broadcast_step(v_state);
    END IF;
  END LOOP;
END;
$$;

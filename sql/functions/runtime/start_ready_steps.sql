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
  v_counts integer[];
  v_delays integer[];
  v_queues text[];
  v_modes text[];
  v_step text;
  v_tasks integer;
  v_delay integer;
  v_queue text;
  v_mode text;
  v_state pgflow.step_states;
  v_realtime boolean := pg_catalog.to_regprocedure('realtime.send(jsonb,text,text,boolean)') IS NOT NULL;
BEGIN
  -- One UPDATE (0013): every caller holds the run row lock (or created the run), so the ready
  -- steps need no separate ordered lock first. From 0014 the same statement checks the run is
  -- started and reads each started step's definition (no look-up per run and per step).
  WITH started AS (
    UPDATE pgflow.step_states AS ss
       SET status = 'started', started_at = pg_catalog.now(), remaining_tasks = ss.initial_tasks
      FROM pgflow.runs AS r, pgflow.steps AS s
     WHERE ss.run_id = start_ready_steps.run_id
       AND ss.status = 'created' AND ss.remaining_deps = 0 AND ss.initial_tasks > 0
       AND r.run_id = ss.run_id AND r.status = 'started'
       AND s.flow_slug = ss.flow_slug AND s.step_slug = ss.step_slug
    RETURNING ss.step_slug, r.flow_slug, ss.initial_tasks, coalesce(s.opt_start_delay, 0) AS delay, s.queue_name,
              s.execution_mode
  )
  SELECT pg_catalog.min(x.flow_slug), pg_catalog.array_agg(x.step_slug ORDER BY x.step_slug),
         pg_catalog.array_agg(x.initial_tasks ORDER BY x.step_slug), pg_catalog.array_agg(x.delay ORDER BY x.step_slug),
         pg_catalog.array_agg(x.queue_name ORDER BY x.step_slug), pg_catalog.array_agg(x.execution_mode ORDER BY x.step_slug)
  INTO v_flow, v_started, v_counts, v_delays, v_queues, v_modes
  FROM started AS x;

  IF v_started IS NULL THEN
    RETURN;
  END IF;

  FOR v_i IN 1 .. pg_catalog.cardinality(v_started) LOOP
    v_step := v_started[v_i];
    v_tasks := v_counts[v_i];
    v_delay := v_delays[v_i];
    v_queue := v_queues[v_i];
    v_mode := v_modes[v_i];
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

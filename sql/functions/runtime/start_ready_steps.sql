-- Starts the ready steps of a started run (created, every dependency done, at least one task):
-- each becomes started with remaining_tasks = initial_tasks, and gets one task per task_index; a
-- queue-backed step's tasks are sent to its queue in one pgmq.send_batch (with the step's start
-- delay), a manual step's are created started with no message (_start_manual_tasks).
-- A resumed run (run_restarts.restart_kind 'resume', resume_run) reuses its source's work: of a starting step,
-- every task the source completed at the same task index is created completed with the source
-- task's output (attempts_count 0, no message), when the step's dependencies ended exactly as in
-- the source (same state, equal output: the task's input is then the source task's) and the step
-- has as many tasks as in the source. The other tasks are sent as usual. The reused tasks complete
-- through the completion core once every starting step has its tasks, so a step all of whose
-- tasks are reused completes, and its children start, as after a worker's last report.
-- The caller holds the run row lock (or created the run), so the ready steps need no separate
-- ordered lock first.
CREATE OR REPLACE FUNCTION pgflow.start_ready_steps(run_id uuid)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_flow text;
  v_source uuid;
  v_started text[];
  v_step text;
  v_tasks integer;
  v_delay integer;
  v_queue text;
  v_mode text;
  v_state pgflow.step_states;
  v_reuse integer[];
  v_reuse_outputs jsonb[];
  v_reused_steps text[] := '{}';
  v_reused_indexes integer[] := '{}';
  v_reused_outputs jsonb[] := '{}';
  v_reused_modes text[] := '{}';
  v_realtime boolean := pg_catalog.to_regprocedure('realtime.send(jsonb,text,text,boolean)') IS NOT NULL;
BEGIN
  SELECT r.flow_slug INTO v_flow
  FROM pgflow.runs AS r
  WHERE r.run_id = start_ready_steps.run_id AND r.status = 'started';
  IF v_flow IS NULL THEN
    RETURN;
  END IF;

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
  -- only when steps start: one primary-key probe for a resumed run's source
  SELECT rr.restart_of_run_id INTO v_source
  FROM pgflow.run_restarts AS rr
  WHERE rr.run_id = start_ready_steps.run_id AND rr.restart_kind = 'resume';

  FOREACH v_step IN ARRAY v_started LOOP
    SELECT ss.initial_tasks, coalesce(s.opt_start_delay, 0), s.queue_name, s.execution_mode
    INTO v_tasks, v_delay, v_queue, v_mode
    FROM pgflow.step_states AS ss
    JOIN pgflow.steps AS s ON s.flow_slug = ss.flow_slug AND s.step_slug = ss.step_slug
    WHERE ss.run_id = start_ready_steps.run_id AND ss.step_slug = v_step;

    v_reuse := NULL;
    IF v_source IS NOT NULL THEN
      SELECT pg_catalog.array_agg(t.task_index ORDER BY t.task_index), pg_catalog.array_agg(t.output ORDER BY t.task_index)
      INTO v_reuse, v_reuse_outputs
      FROM pgflow.step_tasks AS t
      WHERE t.run_id = v_source AND t.step_slug = v_step AND t.status = 'completed'
        AND EXISTS (SELECT 1 FROM pgflow.step_states AS o
                    WHERE o.run_id = v_source AND o.step_slug = v_step AND o.initial_tasks = v_tasks)
        AND NOT EXISTS (
          SELECT 1
          FROM pgflow.deps AS d
          JOIN pgflow.step_states AS n ON n.run_id = start_ready_steps.run_id AND n.step_slug = d.dep_slug
          LEFT JOIN pgflow.step_states AS o ON o.run_id = v_source AND o.step_slug = d.dep_slug
          WHERE d.flow_slug = v_flow AND d.step_slug = v_step
            AND (o.status IS DISTINCT FROM n.status OR o.output IS DISTINCT FROM n.output));
    END IF;

    IF v_mode = 'manual' THEN
      -- no queue, no message (docs/manual-tasks.md); a reused one completes below, as a manual task
      PERFORM pgflow._start_manual_tasks(start_ready_steps.run_id, v_step);
      IF v_reuse IS NOT NULL THEN
        UPDATE pgflow.step_tasks AS t SET attempts_count = 0
         WHERE t.run_id = start_ready_steps.run_id AND t.step_slug = v_step AND t.task_index = ANY (v_reuse);
      END IF;
    ELSIF v_reuse IS NULL THEN
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
    ELSE
      -- the tasks to run again, sent in task_index order; the reused ones, started with no message
      -- and no attempt, complete below
      IF pg_catalog.cardinality(v_reuse) < v_tasks THEN
        WITH fresh AS (
          SELECT g.i, pg_catalog.row_number() OVER (ORDER BY g.i) AS k
          FROM pg_catalog.generate_series(0, v_tasks - 1) AS g (i)
          WHERE g.i <> ALL (v_reuse)
        ), sent AS (
          SELECT m.msg_id, m.k
          FROM pgmq.send_batch(
                 v_queue,
                 ARRAY(SELECT pg_catalog.jsonb_build_object('flow_slug', v_flow, 'run_id', start_ready_steps.run_id,
                                                            'step_slug', v_step, 'task_index', f.i)
                       FROM fresh AS f ORDER BY f.k),
                 v_delay) WITH ORDINALITY AS m (msg_id, k)
        )
        INSERT INTO pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id)
        SELECT v_flow, start_ready_steps.run_id, v_step, f.i, v_queue, m.msg_id
        FROM fresh AS f JOIN sent AS m ON m.k = f.k
        ORDER BY f.i;
      END IF;
      INSERT INTO pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id, status,
                                     attempts_count, started_at)
      SELECT v_flow, start_ready_steps.run_id, v_step, r.i, v_queue, NULL, 'started', 0, pg_catalog.now()
      FROM pg_catalog.unnest(v_reuse) AS r (i)
      ORDER BY r.i;
    END IF;
    IF v_reuse IS NOT NULL THEN
      v_reused_steps := v_reused_steps || pg_catalog.array_fill(v_step, ARRAY[pg_catalog.cardinality(v_reuse)]);
      v_reused_indexes := v_reused_indexes || v_reuse;
      v_reused_outputs := v_reused_outputs || v_reuse_outputs;
      v_reused_modes := v_reused_modes || pg_catalog.array_fill(v_mode, ARRAY[pg_catalog.cardinality(v_reuse)]);
    END IF;

    IF v_realtime AND v_mode <> 'manual' THEN
      SELECT ss.* INTO v_state FROM pgflow.step_states AS ss
      WHERE ss.run_id = start_ready_steps.run_id AND ss.step_slug = v_step;
      PERFORM pgflow._broadcast_step(v_state);
    END IF;
  END LOOP;

  -- Reused tasks complete one by one, each as a report of it would (a step's last one completes the
  -- step and moves the run on, which may start and reuse further steps).
  FOR v_i IN 1 .. pg_catalog.cardinality(v_reused_steps) LOOP
    PERFORM pgflow._complete_started_tasks(ARRAY[start_ready_steps.run_id], ARRAY[v_reused_steps[v_i]],
                                           ARRAY[v_reused_indexes[v_i]], ARRAY[v_reused_outputs[v_i]],
                                           v_reused_modes[v_i]);
  END LOOP;
END;
$$;

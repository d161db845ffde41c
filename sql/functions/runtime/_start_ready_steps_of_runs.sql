-- The ready steps of several runs at once (complete_tasks' set-based pass, start_flows): what
-- start_ready_steps(run_id) for each run of run_ids, in array order, does, when every step that
-- starts is queue-backed and all of them send to one queue with one start delay and realtime.send
-- does not exist. Then the step states are started with one UPDATE and every task's message goes
-- out in one pgmq.send_batch, in the order the calls per run would send them (runs in array
-- order, steps by slug, tasks by index), and the tasks are created with one INSERT. A resumed run
-- (run_restarts.restart_kind 'resume') reuses tasks as its steps start, which only start_ready_steps does: with
-- one among the runs, as with a manual step among the steps, it changes nothing. Otherwise it
-- changes nothing and returns false (the caller starts the runs one by one). The caller holds
-- every run's row lock or created the runs (_start_runs). Returns true when it started the runs'
-- ready steps (or none was ready).
CREATE OR REPLACE FUNCTION pgflow._start_ready_steps_of_runs(run_ids uuid[])
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_queues bigint;
  v_delays bigint;
  v_queue text;
  v_delay integer;
  v_manual boolean;
BEGIN
  SELECT pg_catalog.count(DISTINCT s.queue_name), pg_catalog.count(DISTINCT coalesce(s.opt_start_delay, 0)),
         pg_catalog.min(s.queue_name), pg_catalog.min(coalesce(s.opt_start_delay, 0)),
         pg_catalog.bool_or(s.execution_mode <> 'queue' OR rr.run_id IS NOT NULL)
  INTO v_queues, v_delays, v_queue, v_delay, v_manual
  FROM pg_catalog.unnest(_start_ready_steps_of_runs.run_ids) AS u (run_id)
  JOIN pgflow.runs AS r ON r.run_id = u.run_id AND r.status = 'started'
  LEFT JOIN pgflow.run_restarts AS rr ON rr.run_id = u.run_id AND rr.restart_kind = 'resume'
  JOIN pgflow.step_states AS ss
    ON ss.run_id = u.run_id AND ss.status = 'created' AND ss.remaining_deps = 0 AND ss.initial_tasks > 0
  JOIN pgflow.steps AS s ON s.flow_slug = ss.flow_slug AND s.step_slug = ss.step_slug;
  IF v_queues = 0 THEN
    RETURN true;  -- nothing is ready: what the calls per run would do
  END IF;
  IF v_queues > 1 OR v_delays > 1 OR v_manual
     OR pg_catalog.to_regprocedure('realtime.send(jsonb,text,text,boolean)') IS NOT NULL
     OR (SELECT pg_catalog.count(DISTINCT u.run_id) FROM pg_catalog.unnest(_start_ready_steps_of_runs.run_ids) AS u (run_id))
        <> pg_catalog.cardinality(_start_ready_steps_of_runs.run_ids) THEN
    RETURN false;
  END IF;

  WITH started AS (
    UPDATE pgflow.step_states AS ss
       SET status = 'started', started_at = pg_catalog.now(), remaining_tasks = ss.initial_tasks
      FROM ROWS FROM (pg_catalog.unnest(_start_ready_steps_of_runs.run_ids)) WITH ORDINALITY AS u (run_id, n)
     WHERE ss.run_id = u.run_id
       AND ss.status = 'created' AND ss.remaining_deps = 0 AND ss.initial_tasks > 0
       AND EXISTS (SELECT 1 FROM pgflow.runs AS r WHERE r.run_id = u.run_id AND r.status = 'started')
    RETURNING ss.flow_slug, ss.run_id, ss.step_slug, ss.initial_tasks, u.n
  ), tasks AS (
    SELECT st.flow_slug, st.run_id, st.step_slug, g.i AS task_index,
           pg_catalog.row_number() OVER (ORDER BY st.n, st.step_slug, g.i) AS k
    FROM started AS st
    CROSS JOIN LATERAL pg_catalog.generate_series(0, st.initial_tasks - 1) AS g (i)
  ), sent AS (
    SELECT m.msg_id, m.k
    FROM pgmq.send_batch(
           v_queue,
           ARRAY(SELECT pg_catalog.jsonb_build_object('flow_slug', t.flow_slug, 'run_id', t.run_id,
                                                      'step_slug', t.step_slug, 'task_index', t.task_index)
                 FROM tasks AS t ORDER BY t.k),
           v_delay) WITH ORDINALITY AS m (msg_id, k)
  )
  INSERT INTO pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, queue_name, message_id)
  SELECT t.flow_slug, t.run_id, t.step_slug, t.task_index::integer, v_queue, m.msg_id
  FROM tasks AS t
  JOIN sent AS m ON m.k = t.k
  ORDER BY t.k;
  RETURN true;
END;
$$;
REVOKE ALL ON FUNCTION pgflow._start_ready_steps_of_runs(uuid[]) FROM PUBLIC;

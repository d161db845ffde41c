-- Creates the tasks of a manual step that start_ready_steps just started (the caller holds the run
-- row lock and has set the step started with its initial_tasks): one task per task_index
-- 0 .. initial_tasks - 1 (one for a single step, one per item for a map step), durable rows with
-- execution_mode 'manual', status started, no queue, no message, no worker (started_at = queued_at
-- = now(), attempts_count 1). Nothing is sent to PGMQ. Broadcasts the step's start like a
-- queue-backed step. Trusted code finishes each task with complete_manual_task/fail_manual_task.
CREATE OR REPLACE FUNCTION pgflow._start_manual_tasks(p_run_id uuid, p_step_slug text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_state pgflow.step_states;
BEGIN
  SELECT ss.* INTO v_state FROM pgflow.step_states AS ss
  WHERE ss.run_id = p_run_id AND ss.step_slug = p_step_slug;

  INSERT INTO pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, status, execution_mode,
                                 queue_name, message_id, attempts_count, queued_at, started_at)
  SELECT v_state.flow_slug, p_run_id, p_step_slug, g.i, 'started', 'manual',
         NULL, NULL, 1, pg_catalog.now(), pg_catalog.now()
  FROM pg_catalog.generate_series(0, v_state.initial_tasks - 1) AS g (i)
  ORDER BY g.i;

  PERFORM pgflow._broadcast_step(v_state);
END;
$$;
REVOKE ALL ON FUNCTION pgflow._start_manual_tasks(uuid, text) FROM PUBLIC;

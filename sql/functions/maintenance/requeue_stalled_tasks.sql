-- Gives stalled tasks back to the queue. A queue-backed task (manual tasks are ignored: no worker,
-- no message) is stalled when it is started (and not
-- permanently stalled) in a started run and a started step, and its started_at is older than
-- the effective timeout (coalesce(step, flow)) + 30 s. While requeued_count < 3 it goes back to
-- queued (started_at and last_worker_id cleared, requeued_count + 1) and its message becomes
-- visible now; after that it is marked permanently_stalled_at, its message is archived and its
-- status stays started. Rows locked by someone else are skipped. Returns how many tasks were
-- requeued. attempts_count is not reset: a re-claim uses an attempt.
CREATE OR REPLACE FUNCTION pgflow.requeue_stalled_tasks()
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = ''
AS $$
DECLARE
  v_req_runs uuid[];
  v_req_steps text[];
  v_req_idx integer[];
  v_dead_runs uuid[];
  v_dead_steps text[];
  v_dead_idx integer[];
BEGIN
  WITH candidates AS (
    SELECT t.run_id, t.step_slug, t.task_index
    FROM pgflow.step_tasks AS t
    JOIN pgflow.runs AS r ON r.run_id = t.run_id
    JOIN pgflow.step_states AS ss ON ss.run_id = t.run_id AND ss.step_slug = t.step_slug
    JOIN pgflow.steps AS s ON s.flow_slug = t.flow_slug AND s.step_slug = t.step_slug
    JOIN pgflow.flows AS f ON f.flow_slug = t.flow_slug
    WHERE t.status = 'started'
      AND t.execution_mode = 'queue'  -- a manual task has no worker and no message to recover
      AND t.permanently_stalled_at IS NULL
      AND r.status = 'started'
      AND ss.status = 'started'
      AND t.started_at < pg_catalog.now() - pg_catalog.make_interval(secs => coalesce(s.opt_timeout, f.opt_timeout) + 30)
    ORDER BY t.run_id, t.step_slug, t.task_index
    FOR UPDATE OF t SKIP LOCKED
  ), requeued AS (
    UPDATE pgflow.step_tasks AS t
       SET status = 'queued', started_at = NULL, last_worker_id = NULL,
           requeued_count = t.requeued_count + 1, last_requeued_at = pg_catalog.now()
      FROM candidates AS c
     WHERE t.run_id = c.run_id AND t.step_slug = c.step_slug AND t.task_index = c.task_index
       AND t.requeued_count < 3
    RETURNING 'requeued'::text AS outcome, t.run_id, t.step_slug, t.task_index
  ), stalled AS (
    UPDATE pgflow.step_tasks AS t
       SET permanently_stalled_at = pg_catalog.now()
      FROM candidates AS c
     WHERE t.run_id = c.run_id AND t.step_slug = c.step_slug AND t.task_index = c.task_index
       AND t.requeued_count >= 3
    RETURNING 'stalled'::text AS outcome, t.run_id, t.step_slug, t.task_index
  ), changed AS (
    SELECT * FROM requeued UNION ALL SELECT * FROM stalled
  )
  SELECT pg_catalog.array_agg(x.run_id) FILTER (WHERE x.outcome = 'requeued'),
         pg_catalog.array_agg(x.step_slug) FILTER (WHERE x.outcome = 'requeued'),
         pg_catalog.array_agg(x.task_index) FILTER (WHERE x.outcome = 'requeued'),
         pg_catalog.array_agg(x.run_id) FILTER (WHERE x.outcome = 'stalled'),
         pg_catalog.array_agg(x.step_slug) FILTER (WHERE x.outcome = 'stalled'),
         pg_catalog.array_agg(x.task_index) FILTER (WHERE x.outcome = 'stalled')
  INTO v_req_runs, v_req_steps, v_req_idx, v_dead_runs, v_dead_steps, v_dead_idx
  FROM changed AS x;

  IF v_req_runs IS NOT NULL THEN
    PERFORM pgflow._set_task_messages_vt(v_req_runs, v_req_steps, v_req_idx,
                                         pg_catalog.array_fill(0, ARRAY[pg_catalog.cardinality(v_req_runs)]));
  END IF;
  IF v_dead_runs IS NOT NULL THEN
    PERFORM pgflow._archive_task_messages(v_dead_runs, v_dead_steps, v_dead_idx);
  END IF;
  RETURN coalesce(pg_catalog.cardinality(v_req_runs), 0);
END;
$$;

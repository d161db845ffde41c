-- Fails a started run because of p_step_slug: the step becomes failed, the run failed, every
-- queued/started task of the run cancelled, and the messages of the cancelled tasks and of the
-- step's failed task(s) archived, all in the caller's transaction. A run that is no longer
-- started is left alone (no second terminal transition, no duplicate event). Returns whether
-- it failed the run.
CREATE OR REPLACE FUNCTION pgflow._fail_run(p_run_id uuid, p_step_slug text, p_error_message text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_run pgflow.runs;
  v_state pgflow.step_states;
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes integer[];
BEGIN
  UPDATE pgflow.runs AS r
     SET status = 'failed', failed_at = pg_catalog.now()
   WHERE r.run_id = p_run_id AND r.status = 'started'
  RETURNING r.* INTO v_run;
  IF v_run.run_id IS NULL THEN
    RETURN false;
  END IF;

  UPDATE pgflow.step_states AS ss
     SET status = 'failed', failed_at = pg_catalog.now(), error_message = p_error_message
   WHERE ss.run_id = p_run_id AND ss.step_slug = p_step_slug AND ss.status IN ('created', 'started')
  RETURNING ss.* INTO v_state;

  WITH cancelled AS (
    UPDATE pgflow.step_tasks AS t
       SET status = 'cancelled'
     WHERE t.run_id = p_run_id AND t.status IN ('queued', 'started')
    RETURNING t.run_id, t.step_slug, t.task_index
  ), culprits AS (
    SELECT t.run_id, t.step_slug, t.task_index
    FROM pgflow.step_tasks AS t
    WHERE t.run_id = p_run_id AND t.step_slug = p_step_slug AND t.status = 'failed'
  ), keys AS (
    SELECT * FROM cancelled UNION ALL SELECT * FROM culprits
  )
  SELECT pg_catalog.array_agg(k.run_id), pg_catalog.array_agg(k.step_slug), pg_catalog.array_agg(k.task_index)
  INTO v_run_ids, v_step_slugs, v_task_indexes
  FROM keys AS k;

  PERFORM pgflow._archive_task_messages(v_run_ids, v_step_slugs, v_task_indexes);

  IF v_state.run_id IS NOT NULL THEN
    PERFORM pgflow._broadcast_step(v_state);
  END IF;
  PERFORM pgflow._broadcast_run(v_run, p_error_message);
  RETURN true;
END;
$$;

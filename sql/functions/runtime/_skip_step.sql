-- Skips one created/started step (plain skip): the step's queued/started tasks become skipped
-- and their messages are archived, the run has one step less to wait for, the children are
-- released. Returns false (and changes nothing) when the step is already terminal.
CREATE OR REPLACE FUNCTION pgflow._skip_step(p_run_id uuid, p_step_slug text, p_skip_reason text, p_error_message text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_state pgflow.step_states;
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes integer[];
BEGIN
  UPDATE pgflow.step_states AS ss
     SET status = 'skipped', skip_reason = p_skip_reason, skipped_at = pg_catalog.now(),
         remaining_tasks = NULL, error_message = coalesce(p_error_message, ss.error_message)
   WHERE ss.run_id = p_run_id AND ss.step_slug = p_step_slug AND ss.status IN ('created', 'started')
  RETURNING ss.* INTO v_state;
  IF v_state.run_id IS NULL THEN
    RETURN false;
  END IF;

  WITH skipped AS (
    UPDATE pgflow.step_tasks AS t
       SET status = 'skipped'
     WHERE t.run_id = p_run_id AND t.step_slug = p_step_slug AND t.status IN ('queued', 'started')
    RETURNING t.run_id, t.step_slug, t.task_index
  )
  SELECT pg_catalog.array_agg(k.run_id), pg_catalog.array_agg(k.step_slug), pg_catalog.array_agg(k.task_index)
  INTO v_run_ids, v_step_slugs, v_task_indexes
  FROM skipped AS k;
  PERFORM pgflow._archive_task_messages(v_run_ids, v_step_slugs, v_task_indexes);

  UPDATE pgflow.runs AS r SET remaining_steps = r.remaining_steps - 1 WHERE r.run_id = p_run_id;
  PERFORM pgflow._release_children_of_skipped(p_run_id, v_state.flow_slug, p_step_slug);
  PERFORM pgflow._broadcast_step(v_state);
  RETURN true;
END;
$$;

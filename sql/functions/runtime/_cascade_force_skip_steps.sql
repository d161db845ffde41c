-- Skips a step and every step below it in the DAG. The step keeps p_skip_reason, its
-- descendants get 'dependency_skipped'. Only created/started steps change; their queued/started
-- tasks become skipped and their messages are archived; the run's remaining_steps drops by the
-- number of steps skipped. Returns that number.
CREATE OR REPLACE FUNCTION pgflow._cascade_force_skip_steps(run_id uuid, step_slug text, skip_reason text)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_flow text;
  v_skipped text[];
  v_state pgflow.step_states;
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes integer[];
BEGIN
  SELECT r.flow_slug INTO v_flow FROM pgflow.runs AS r WHERE r.run_id = _cascade_force_skip_steps.run_id;
  IF v_flow IS NULL THEN
    RETURN 0;
  END IF;

  WITH RECURSIVE below (step_slug) AS (
    SELECT _cascade_force_skip_steps.step_slug
    UNION
    SELECT d.step_slug
    FROM pgflow.deps AS d
    JOIN below AS b ON d.dep_slug = b.step_slug
    WHERE d.flow_slug = v_flow
  ), skipped AS (
    UPDATE pgflow.step_states AS ss
       SET status = 'skipped',
           skip_reason = CASE WHEN ss.step_slug = _cascade_force_skip_steps.step_slug
                              THEN _cascade_force_skip_steps.skip_reason ELSE 'dependency_skipped' END,
           skipped_at = pg_catalog.now(),
           remaining_tasks = NULL
     WHERE ss.run_id = _cascade_force_skip_steps.run_id
       AND ss.step_slug IN (SELECT b.step_slug FROM below AS b)
       AND ss.status IN ('created', 'started')
    RETURNING ss.step_slug
  )
  SELECT pg_catalog.array_agg(s.step_slug ORDER BY s.step_slug) INTO v_skipped FROM skipped AS s;

  IF v_skipped IS NULL THEN
    RETURN 0;
  END IF;

  WITH skipped_tasks AS (
    UPDATE pgflow.step_tasks AS t
       SET status = 'skipped'
     WHERE t.run_id = _cascade_force_skip_steps.run_id
       AND t.step_slug = ANY (v_skipped)
       AND t.status IN ('queued', 'started')
    RETURNING t.run_id, t.step_slug, t.task_index
  )
  SELECT pg_catalog.array_agg(k.run_id), pg_catalog.array_agg(k.step_slug), pg_catalog.array_agg(k.task_index)
  INTO v_run_ids, v_step_slugs, v_task_indexes
  FROM skipped_tasks AS k;
  PERFORM pgflow._archive_task_messages(v_run_ids, v_step_slugs, v_task_indexes);

  UPDATE pgflow.runs AS r
     SET remaining_steps = r.remaining_steps - pg_catalog.cardinality(v_skipped)
   WHERE r.run_id = _cascade_force_skip_steps.run_id;

  FOR v_state IN
    SELECT ss.* FROM pgflow.step_states AS ss
    WHERE ss.run_id = _cascade_force_skip_steps.run_id AND ss.step_slug = ANY (v_skipped)
    ORDER BY ss.step_slug
  LOOP
    PERFORM pgflow._broadcast_step(v_state);
  END LOOP;

  RETURN pg_catalog.cardinality(v_skipped);
END;
$$;

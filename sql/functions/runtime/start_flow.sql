-- Starts a run of a flow. A flow with root map steps needs a JSON array input (each element
-- becomes one task). Takes the flow advisory lock in shared mode, so a run never starts while
-- the flow is being recompiled or deleted.
CREATE OR REPLACE FUNCTION pgflow.start_flow(flow_slug text, input jsonb, run_id uuid DEFAULT NULL)
RETURNS SETOF pgflow.runs
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_run pgflow.runs;
  v_has_root_map boolean;
  v_root_tasks integer;
BEGIN
  PERFORM pg_catalog.pg_advisory_xact_lock_shared(1, pg_catalog.hashtext(start_flow.flow_slug));

  IF NOT EXISTS (SELECT 1 FROM pgflow.flows AS f WHERE f.flow_slug = start_flow.flow_slug) THEN
    RAISE EXCEPTION 'flow "%" does not exist', start_flow.flow_slug
      USING ERRCODE = 'PF006', HINT = 'start a worker for the flow (startup compilation creates it) or create it with pgflow.create_flow()';
  END IF;
  IF start_flow.input IS NULL THEN
    RAISE EXCEPTION 'flow "%": the run input must not be NULL (use ''{}'' for no input)', start_flow.flow_slug
      USING ERRCODE = '22004';
  END IF;

  SELECT EXISTS (SELECT 1 FROM pgflow.steps AS s
                 WHERE s.flow_slug = start_flow.flow_slug AND s.step_type = 'map' AND s.deps_count = 0)
  INTO v_has_root_map;
  IF v_has_root_map AND pg_catalog.jsonb_typeof(start_flow.input) <> 'array' THEN
    RAISE EXCEPTION 'flow "%" has a root map step, so its input must be a JSON array (got %)',
      start_flow.flow_slug, pg_catalog.jsonb_typeof(start_flow.input)
      USING ERRCODE = '22023';
  END IF;
  IF v_has_root_map THEN
    v_root_tasks := pg_catalog.jsonb_array_length(start_flow.input);
  END IF;

  INSERT INTO pgflow.runs (run_id, flow_slug, input, remaining_steps)
  SELECT coalesce(start_flow.run_id, pg_catalog.gen_random_uuid()), start_flow.flow_slug, start_flow.input,
         (SELECT pg_catalog.count(*)::integer FROM pgflow.steps AS s WHERE s.flow_slug = start_flow.flow_slug)
  RETURNING * INTO v_run;

  INSERT INTO pgflow.step_states (flow_slug, run_id, step_slug, remaining_deps, initial_tasks)
  SELECT s.flow_slug, v_run.run_id, s.step_slug, s.deps_count,
         CASE WHEN s.step_type = 'map' AND s.deps_count = 0 THEN v_root_tasks
              WHEN s.step_type = 'map' THEN NULL
              ELSE 1 END
  FROM pgflow.steps AS s
  WHERE s.flow_slug = start_flow.flow_slug
  ORDER BY s.step_index;

  PERFORM pgflow._broadcast_run(v_run);
  PERFORM pgflow._advance_run(v_run.run_id);

  RETURN QUERY SELECT r.* FROM pgflow.runs AS r WHERE r.run_id = v_run.run_id;
END;
$$;

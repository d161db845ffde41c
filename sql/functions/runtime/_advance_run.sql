-- Moves a run forward after a change: conditions and taskless steps settle, then ready steps
-- start and the run completes if nothing is left. Caller holds the run row lock.
-- Only what the flow can need runs: the condition cascade only when a step of the flow has a
-- condition, the taskless cascade only when the flow has a map step (only a map can have zero
-- tasks), ready steps only while a step is left, and run completion only when none is.
CREATE OR REPLACE FUNCTION pgflow._advance_run(p_run_id uuid)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_conditions boolean;
  v_maps boolean;
  v_status text;
  v_remaining integer;
BEGIN
  -- the flow's flags and the run's state in one look-up; read again only after a cascade
  SELECT pg_catalog.bool_or(s.required_input_pattern IS NOT NULL OR s.forbidden_input_pattern IS NOT NULL),
         pg_catalog.bool_or(s.step_type = 'map'), pg_catalog.min(r.status), pg_catalog.min(r.remaining_steps)
  INTO v_conditions, v_maps, v_status, v_remaining
  FROM pgflow.runs AS r
  LEFT JOIN pgflow.steps AS s ON s.flow_slug = r.flow_slug
  WHERE r.run_id = p_run_id;
  IF v_conditions AND NOT pgflow.cascade_resolve_conditions(p_run_id) THEN
    RETURN;
  END IF;
  IF v_maps THEN
    PERFORM pgflow.cascade_complete_taskless_steps(p_run_id);
  END IF;
  IF v_conditions OR v_maps THEN
    SELECT r.status, r.remaining_steps INTO v_status, v_remaining FROM pgflow.runs AS r WHERE r.run_id = p_run_id;
  END IF;
  IF v_status IS DISTINCT FROM 'started' THEN
    RETURN;
  END IF;
  IF v_remaining = 0 THEN
    -- no step is created or started any more, so none can be ready
    PERFORM pgflow.maybe_complete_run(p_run_id);
  ELSE
    PERFORM pgflow.start_ready_steps(p_run_id);
  END IF;
END;
$$;

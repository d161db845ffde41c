-- Moves a run forward after a change: conditions and taskless steps settle, then ready steps
-- start and the run completes if nothing is left. Caller holds the run row lock.
CREATE OR REPLACE FUNCTION pgflow._advance_run(p_run_id uuid)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
BEGIN
  IF NOT pgflow.cascade_resolve_conditions(p_run_id) THEN
    RETURN;
  END IF;
  PERFORM pgflow.cascade_complete_taskless_steps(p_run_id);
  IF NOT EXISTS (SELECT 1 FROM pgflow.runs AS r WHERE r.run_id = p_run_id AND r.status = 'started') THEN
    RETURN;
  END IF;
  PERFORM pgflow.start_ready_steps(p_run_id);
  PERFORM pgflow.maybe_complete_run(p_run_id);
END;
$$;

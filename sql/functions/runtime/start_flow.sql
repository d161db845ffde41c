-- Starts a run of a flow. A flow with root map steps needs a JSON array input (each element
-- becomes one task). Takes the flow advisory lock in shared mode, so a run never starts while
-- the flow is being recompiled or deleted. The work is _start_runs' (shared with start_flows).
CREATE OR REPLACE FUNCTION pgflow.start_flow(flow_slug text, input jsonb, run_id uuid DEFAULT NULL)
RETURNS SETOF pgflow.runs
LANGUAGE sql
VOLATILE
SET search_path = ''
AS $$
  SELECT * FROM pgflow._start_runs('start_flow', flow_slug,
                                   CASE WHEN input IS NOT NULL THEN pg_catalog.jsonb_build_array(input) END, run_id);
$$;

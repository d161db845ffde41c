-- start_flow, then the new run with its step states (for clients that need both at once).
CREATE OR REPLACE FUNCTION pgflow.start_flow_with_states(flow_slug text, input jsonb, run_id uuid DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_run_id uuid;
BEGIN
  SELECT r.run_id INTO v_run_id
  FROM pgflow.start_flow(start_flow_with_states.flow_slug, start_flow_with_states.input, start_flow_with_states.run_id) AS r;
  RETURN pgflow.get_run_with_states(v_run_id);
END;
$$;

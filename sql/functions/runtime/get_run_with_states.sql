-- A run with all its step states, as one JSON document: {"run": {...}, "steps": [...]}.
CREATE OR REPLACE FUNCTION pgflow.get_run_with_states(run_id uuid)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_result jsonb;
BEGIN
  SELECT pg_catalog.jsonb_build_object(
           'run', pg_catalog.to_jsonb(r),
           'steps', coalesce((
             SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(ss) ORDER BY s.step_index)
             FROM pgflow.step_states AS ss
             JOIN pgflow.steps AS s ON s.flow_slug = ss.flow_slug AND s.step_slug = ss.step_slug
             WHERE ss.run_id = r.run_id), '[]'::jsonb))
  INTO v_result
  FROM pgflow.runs AS r
  WHERE r.run_id = get_run_with_states.run_id;
  IF v_result IS NULL THEN
    RAISE EXCEPTION 'run % does not exist', get_run_with_states.run_id USING ERRCODE = 'PF006';
  END IF;
  RETURN v_result;
END;
$$;

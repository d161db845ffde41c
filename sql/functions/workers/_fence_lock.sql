-- The fence's lock order: the worker_functions rows of the names, then their active fences, each
-- in name order (register_worker locks a function row the same way, by its upsert). Returns the
-- names distinct and sorted. Errors: 22004 for an empty array or a NULL name.
CREATE OR REPLACE FUNCTION pgflow._fence_lock(function_names text[], caller text)
RETURNS text[]
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_names text[];
BEGIN
  IF function_names IS NULL OR pg_catalog.cardinality(function_names) = 0
     OR pg_catalog.array_position(function_names, NULL) IS NOT NULL THEN
    RAISE EXCEPTION '%(): name at least one worker function, and no NULL', caller USING ERRCODE = '22004';
  END IF;
  SELECT pg_catalog.array_agg(DISTINCT n ORDER BY n) INTO v_names FROM pg_catalog.unnest(function_names) AS n;
  PERFORM 1 FROM pgflow.worker_functions AS wf
  WHERE wf.function_name = ANY (v_names) ORDER BY wf.function_name FOR UPDATE;
  PERFORM 1 FROM pgflow.fences AS f
  WHERE f.function_name = ANY (v_names) AND f.state = 'active' ORDER BY f.function_name FOR UPDATE;
  RETURN v_names;
END;
$$;

REVOKE ALL ON FUNCTION pgflow._fence_lock(text[], text) FROM PUBLIC;

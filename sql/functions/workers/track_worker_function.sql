-- Registers (or touches) a worker function; never changes its enabled flag.
CREATE OR REPLACE FUNCTION pgflow.track_worker_function(function_name text)
RETURNS void
LANGUAGE sql
VOLATILE
SET search_path = ''
AS $$
  INSERT INTO pgflow.worker_functions AS wf (function_name, updated_at)
  VALUES (track_worker_function.function_name, pg_catalog.clock_timestamp())
  ON CONFLICT (function_name) DO UPDATE SET updated_at = pg_catalog.clock_timestamp();
$$;

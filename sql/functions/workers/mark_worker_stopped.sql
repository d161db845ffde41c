CREATE OR REPLACE FUNCTION pgflow.mark_worker_stopped(worker_id uuid)
RETURNS void
LANGUAGE sql
VOLATILE
SET search_path = ''
AS $$
  UPDATE pgflow.workers AS w
     SET stopped_at = pg_catalog.clock_timestamp()
   WHERE w.worker_id = mark_worker_stopped.worker_id;
$$;

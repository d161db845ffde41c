-- Heartbeat. Returns true when the worker should stop polling: it was deprecated, or its row
-- no longer exists (it can no longer claim anything).
CREATE OR REPLACE FUNCTION pgflow.send_heartbeat(worker_id uuid)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_deprecated boolean;
BEGIN
  UPDATE pgflow.workers AS w
     SET last_heartbeat_at = pg_catalog.clock_timestamp()
   WHERE w.worker_id = send_heartbeat.worker_id
  RETURNING w.deprecated_at IS NOT NULL INTO v_deprecated;
  RETURN coalesce(v_deprecated, true);
END;
$$;

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

-- Heartbeat naming the route the worker registered (the reference worker uses it where it
-- exists). Refused with PF007 when the id is registered for another function, queue,
-- flow or step: the caller is a stale process under a reused id (or a misconfigured one), and it
-- must never be answered as the id's current owner nor refresh that owner's liveness. A missing
-- row answers true (stop), as the one-argument form does.
CREATE OR REPLACE FUNCTION pgflow.send_heartbeat(
  worker_id uuid,
  function_name text,
  queue_name text,
  flow_slug text,
  step_slug text DEFAULT NULL
)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_worker pgflow.workers;
BEGIN
  SELECT w.* INTO v_worker FROM pgflow.workers AS w WHERE w.worker_id = send_heartbeat.worker_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN true;
  END IF;
  IF (v_worker.function_name, v_worker.queue_name, v_worker.flow_slug, v_worker.step_slug)
     IS DISTINCT FROM (send_heartbeat.function_name, send_heartbeat.queue_name, send_heartbeat.flow_slug,
                       send_heartbeat.step_slug) THEN
    RAISE EXCEPTION 'worker id % is registered for function "%" (queue "%"), not for function "%" (queue "%") this heartbeat comes from',
      send_heartbeat.worker_id, v_worker.function_name, v_worker.queue_name, send_heartbeat.function_name,
      send_heartbeat.queue_name
      USING ERRCODE = 'PF007',
            HINT = 'this process is stale or misconfigured: stop it; a worker id belongs to one registration';
  END IF;
  UPDATE pgflow.workers AS w
     SET last_heartbeat_at = pg_catalog.clock_timestamp()
   WHERE w.worker_id = send_heartbeat.worker_id;
  RETURN v_worker.deprecated_at IS NOT NULL;
END;
$$;
REVOKE ALL ON FUNCTION pgflow.send_heartbeat(uuid, text, text, text, text) FROM PUBLIC;

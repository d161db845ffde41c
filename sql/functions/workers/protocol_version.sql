-- 2 = queue identity: startup ensure_flow_compiled(flow_slug, shape, protocol_version => 2, ...),
-- claim pgflow.claim_tasks(queue_name, msg_ids, worker_id, flow_slug, step_slug).
CREATE OR REPLACE FUNCTION pgflow.protocol_version()
RETURNS integer
LANGUAGE sql
IMMUTABLE
SET search_path = ''
AS $$ SELECT 2 $$;

--@note Protocol-1 baseline: pgflow.protocol_version as migration 0001 installed it, before 0003
--@note replaced it. Frozen: only the released baseline migrations include it. The current
--@note version, and the lines this file reuses, are in functions/workers/protocol_version.sql.
-- The worker/database protocol this schema speaks. A worker states the version it speaks at
-- startup; any mismatch is refused before registration or polling (DESIGN.md "protocol version").
--   1 = released baseline: startup compile ensure_flow_compiled(flow_slug, shape),
--       claim start_tasks(flow_slug, msg_ids, worker_id); the queue is the flow slug.
--@include functions/workers/protocol_version.sql lines=3-7
AS $$ SELECT 1 $$;

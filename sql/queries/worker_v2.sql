-- Database calls of the reference worker speaking protocol 2 (queue identity).
-- The queue is the flow's persisted route (lower(flow_slug) for a plain flow); the claim is
-- pgflow.claim_tasks, which classifies every message before changing anything.

--@name compile
SELECT pgflow.ensure_flow_compiled(%(flow_slug)s, %(shape)s::jsonb, protocol_version => 2,
                                   queue_mode => %(queue_mode)s, route_map => %(route_map)s::jsonb) AS result;

--@name claim
SELECT outcome, message_id, reason, flow_slug, run_id, step_slug, task_index, input, flow_input
FROM pgflow.claim_tasks(%(queue_name)s, %(msg_ids)s::bigint[], %(worker_id)s, %(flow_slug)s, %(step_slug)s);
--@name has_route_heartbeat
-- Schema 0004 and later check heartbeats against the route the worker registered.
SELECT to_regprocedure('pgflow.send_heartbeat(uuid, text, text, text, text)') IS NOT NULL AS available;

--@name heartbeat
SELECT pgflow.send_heartbeat(%(worker_id)s, %(function_name)s, %(queue_name)s, %(flow_slug)s, %(step_slug)s) AS deprecated;

--@name records_worker_version
-- True where register_worker takes the worker's version (schema 0005 and later).
SELECT pg_catalog.to_regprocedure('pgflow.register_worker(uuid, text, text, text, text, text)') IS NOT NULL;

--@name register_with_version
SELECT pgflow.register_worker(%(worker_id)s, %(function_name)s, %(queue_name)s, %(flow_slug)s, %(step_slug)s,
                              worker_version => %(worker_version)s);
--@end

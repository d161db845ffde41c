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

--@name has_batch_reports
-- True where the database has the batch report entry points (schema 0010 and later).
SELECT pg_catalog.to_regprocedure('pgflow.complete_tasks(jsonb)') IS NOT NULL
   AND pg_catalog.to_regprocedure('pgflow.fail_tasks(jsonb)') IS NOT NULL AS available;

--@name complete_many
-- tasks: a JSON array of {run_id, step_slug, task_index, output}, applied in array order, all or nothing.
SELECT count(*) FROM pgflow.complete_tasks(%(tasks)s::jsonb);

--@name fail_many
-- tasks: a JSON array of {run_id, step_slug, task_index, error_message}, applied in array order, all or nothing.
SELECT count(*) FROM pgflow.fail_tasks(%(tasks)s::jsonb);

--@name step_timeouts
-- Effective timeout (seconds) of every step this worker may claim: the step's, else the flow's.
-- Used by any protocol (the columns exist since the baseline schema).
SELECT s.step_slug, COALESCE(s.opt_timeout, f.opt_timeout) AS timeout
FROM pgflow.steps AS s
JOIN pgflow.flows AS f ON f.flow_slug = s.flow_slug
WHERE s.flow_slug = %(flow_slug)s AND (%(step_slug)s::text IS NULL OR s.step_slug = %(step_slug)s);
--@end

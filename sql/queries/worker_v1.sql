-- Database calls of the reference worker speaking protocol 1 (the released baseline).
-- The queue is the flow slug; the claim is start_tasks(flow_slug, msg_ids, worker_id).

--@name protocol_version
SELECT CASE WHEN to_regprocedure('pgflow.protocol_version()') IS NULL THEN NULL
            ELSE pgflow.protocol_version() END AS version;

--@name function_enabled
-- NULL when the function was never registered (it will be created enabled).
SELECT (SELECT wf.enabled FROM pgflow.worker_functions AS wf WHERE wf.function_name = %(function_name)s) AS enabled;

--@name compile
SELECT pgflow.ensure_flow_compiled(%(flow_slug)s, %(shape)s::jsonb) AS result;

--@name register
SELECT pgflow.register_worker(%(worker_id)s, %(function_name)s, %(queue_name)s, %(flow_slug)s, %(step_slug)s);

--@name heartbeat
SELECT pgflow.send_heartbeat(%(worker_id)s) AS deprecated;

--@name read
SELECT msg_id
FROM pgmq.read_with_poll(%(queue_name)s, %(vt)s, %(qty)s, %(max_poll_seconds)s, %(poll_interval_ms)s);

--@name claim
SELECT flow_slug, run_id, step_slug, input, msg_id, task_index, flow_input
FROM pgflow.start_tasks(%(flow_slug)s, %(msg_ids)s::bigint[], %(worker_id)s);

--@name claimed_attempts
-- The attempt each task of one claim batch is in (attempts_count after the claim), read when a
-- handler or a failure's log first needs one (one probe per message, see worker_v2.sql). Protocol
-- 1 queues are named after the flow.
SELECT m.id AS message_id, t.attempts_count
FROM pg_catalog.unnest(%(msg_ids)s::bigint[]) AS m (id)
CROSS JOIN LATERAL (SELECT x.attempts_count, x.status, x.last_worker_id FROM pgflow.step_tasks AS x
                    WHERE x.flow_slug = %(flow_slug)s AND x.message_id = m.id LIMIT 1) AS t
WHERE t.status = 'started' AND t.last_worker_id = %(worker_id)s;

--@name complete
-- Returns how many reports were refused: a task that comes back cancelled (its run was cancelled or
-- failed before the report), whose result nothing records.
SELECT count(*) FILTER (WHERE status = 'cancelled')::integer
FROM pgflow.complete_task(%(run_id)s, %(step_slug)s, %(task_index)s, %(output)s::jsonb);

--@name fail
-- Returns how many reports were refused (as complete).
SELECT count(*) FILTER (WHERE status = 'cancelled')::integer
FROM pgflow.fail_task(%(run_id)s, %(step_slug)s, %(task_index)s, %(error_message)s);

--@name release
-- Messages read but not claimed (the worker is stopping): visible again at once.
SELECT count(*) FROM pgmq.set_vt(%(queue_name)s, %(msg_ids)s::bigint[], 0);

--@name stopped
SELECT pgflow.mark_worker_stopped(%(worker_id)s);
--@end

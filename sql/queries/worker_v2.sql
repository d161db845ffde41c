-- Database calls of the reference worker speaking protocol 2 (queue identity).
-- The queue is the flow's persisted route (lower(flow_slug) for a plain flow); the claim is
-- pgflow.claim_tasks, which classifies every message before changing anything.

--@name compile
SELECT pgflow.ensure_flow_compiled(%(flow_slug)s, %(shape)s::jsonb, protocol_version => 2,
                                   queue_mode => %(queue_mode)s, route_map => %(route_map)s::jsonb) AS result;

--@name claim
SELECT outcome, message_id, reason, flow_slug, run_id, step_slug, task_index, input, flow_input
FROM pgflow.claim_tasks(%(queue_name)s, %(msg_ids)s::bigint[], %(worker_id)s, %(flow_slug)s, %(step_slug)s);

--@name heartbeat
SELECT pgflow.send_heartbeat(%(worker_id)s, %(function_name)s, %(queue_name)s, %(flow_slug)s, %(step_slug)s) AS deprecated;

--@name register_with_version
SELECT pgflow.register_worker(%(worker_id)s, %(function_name)s, %(queue_name)s, %(flow_slug)s, %(step_slug)s,
                              worker_version => %(worker_version)s);

--@name complete_many
-- tasks: a JSON array of {run_id, step_slug, task_index, output}, applied in array order, all or nothing.
-- Returns how many were refused (their task came back cancelled: the run ended before the report).
SELECT count(*) FILTER (WHERE status = 'cancelled')::integer FROM pgflow.complete_tasks(%(tasks)s::jsonb);

--@name fail_many
-- tasks: a JSON array of {run_id, step_slug, task_index, error_message, retry_delay_seconds, fail_now},
-- applied in array order, all or nothing. Returns how many were refused (as complete_many).
SELECT count(*) FILTER (WHERE status = 'cancelled')::integer FROM pgflow.fail_tasks(%(tasks)s::jsonb);

--@name has_retry_control
-- True where fail_task takes a handler's retry delay and fail-now (and fail_tasks elements do).
SELECT pg_catalog.to_regprocedure('pgflow.fail_task(uuid, text, integer, text, double precision, boolean)') IS NOT NULL;

--@name fail_directed
-- retry_delay_seconds: seconds before the next attempt instead of the step's backoff (NULL: the
-- backoff); fail_now: the task fails for good now. Both are ignored once the attempts are used up.
-- Returns 1 when the report was refused (the task came back cancelled), else 0.
SELECT count(*) FILTER (WHERE status = 'cancelled')::integer
FROM pgflow.fail_task(%(run_id)s, %(step_slug)s, %(task_index)s, %(error_message)s,
                      %(retry_delay_seconds)s, %(fail_now)s);

--@name has_cancellations
-- 1 where this schema records cancels (migration 0003: pgflow.run_cancellations) and this role may
-- read them; else 0 (the reason is then "the run failed").
SELECT (pg_catalog.to_regclass('pgflow.run_cancellations') IS NOT NULL
        AND pg_catalog.has_table_privilege(pg_catalog.to_regclass('pgflow.run_cancellations'), 'SELECT'))::integer;

--@name cancel_reasons
-- Why an operator cancelled each of these failed runs (one primary-key probe per run id; a run
-- that failed on its own has no row).
SELECT c.run_id, c.reason FROM pgflow.run_cancellations AS c WHERE c.run_id = ANY (%(run_ids)s::uuid[]);

--@name claimed_attempts
-- The attempt each task of one claim batch is in (attempts_count after the claim), by the claimed
-- messages' identity; read when a handler or a failure's log first needs one. One probe of the
-- (queue_name, message_id) key per message: the status and worker conditions stay outside the
-- probe, or the planner may prefer the partial index on the worker's started tasks and read all of
-- them.
SELECT m.id AS message_id, t.attempts_count
FROM pg_catalog.unnest(%(msg_ids)s::bigint[]) AS m (id)
CROSS JOIN LATERAL (SELECT x.attempts_count, x.status, x.last_worker_id FROM pgflow.step_tasks AS x
                    WHERE x.queue_name = %(queue_name)s AND x.message_id = m.id LIMIT 1) AS t
WHERE t.status = 'started' AND t.last_worker_id = %(worker_id)s;

--@name step_settings
-- Effective timeout (seconds), max_attempts and base_delay (seconds) of every step this worker
-- may claim: the step's, else the flow's. Used by any protocol (the columns exist since the
-- baseline schema).
SELECT s.step_slug, COALESCE(s.opt_timeout, f.opt_timeout) AS timeout,
       COALESCE(s.opt_max_attempts, f.opt_max_attempts) AS max_attempts,
       COALESCE(s.opt_base_delay, f.opt_base_delay) AS base_delay
FROM pgflow.steps AS s
JOIN pgflow.flows AS f ON f.flow_slug = s.flow_slug
WHERE s.flow_slug = %(flow_slug)s AND (%(step_slug)s::text IS NULL OR s.step_slug = %(step_slug)s);

--@name run_input
-- A run's input (TaskContext.flow_input), read once per run by the worker that asks.
SELECT r.input FROM pgflow.runs AS r WHERE r.run_id = %(run_id)s;

--@name ended_tasks
-- Of the tasks a worker is running (parallel arrays; attempts = the attempt each handler runs, NULL
-- where the worker has not read it; n = the position, 1-based),
-- those whose work is no longer wanted: the run or the step is no longer started, or the task is
-- no longer this attempt of this worker (stalled-task recovery requeued it, or another worker
-- took it over). taken_over: the worker must not report this attempt, because the report would
-- end another claim's attempt: one that runs now, or one that can start before the report lands
-- (a requeued task of a run and step that go on). One
-- query per heartbeat for all of a worker's in-flight tasks; used by any protocol. Each row is
-- one key probe per table (LATERAL ... LIMIT 1), never a scan of the runs or step states.
SELECT k.n,
       CASE WHEN t.status = 'started' AND t.last_worker_id IS DISTINCT FROM %(worker_id)s
              THEN 'another worker took the task over (attempt ' || t.attempts_count || ')'
            WHEN t.status = 'started' AND t.attempts_count <> k.attempt
              THEN 'a newer claim of the task runs (attempt ' || t.attempts_count || ')'
            WHEN r.status IS DISTINCT FROM 'started' THEN 'the run ' || coalesce(r.status, 'is gone')
            WHEN t.status = 'queued' AND s.status = 'started'
              THEN 'stalled-task recovery queued the task again (after attempt ' || t.attempts_count || ')'
            WHEN s.status IS DISTINCT FROM 'started'
              THEN 'the step ' || CASE s.status WHEN 'skipped' THEN 'was skipped' ELSE coalesce(s.status, 'is gone') END
            ELSE 'the task is no longer this attempt (' || coalesce(t.status, 'gone') || ')'
       END AS reason,
       coalesce(t.status = 'started' AND (t.attempts_count <> k.attempt OR t.last_worker_id IS DISTINCT FROM %(worker_id)s),
                false)
         OR coalesce(t.status = 'queued' AND r.status = 'started' AND s.status = 'started', false) AS taken_over,
       r.status AS run_status
FROM ROWS FROM (pg_catalog.unnest(%(run_ids)s::uuid[]), pg_catalog.unnest(%(step_slugs)s::text[]),
                pg_catalog.unnest(%(task_indexes)s::integer[]), pg_catalog.unnest(%(attempts)s::integer[]))
     WITH ORDINALITY AS k (run_id, step_slug, task_index, attempt, n)
LEFT JOIN LATERAL (SELECT x.status FROM pgflow.runs AS x WHERE x.run_id = k.run_id LIMIT 1) AS r ON true
LEFT JOIN LATERAL (SELECT x.status FROM pgflow.step_states AS x
                   WHERE x.run_id = k.run_id AND x.step_slug = k.step_slug LIMIT 1) AS s ON true
LEFT JOIN LATERAL (SELECT x.status, x.attempts_count, x.last_worker_id FROM pgflow.step_tasks AS x
                   WHERE x.run_id = k.run_id AND x.step_slug = k.step_slug AND x.task_index = k.task_index
                   LIMIT 1) AS t ON true
WHERE r.status IS DISTINCT FROM 'started' OR s.status IS DISTINCT FROM 'started'
   OR t.status IS DISTINCT FROM 'started' OR t.attempts_count <> k.attempt
   OR t.last_worker_id IS DISTINCT FROM %(worker_id)s;
--@end

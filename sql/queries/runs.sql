-- pgflow runs list / runs show (docs/commands/runs.md). Read-only, SELECT on the pgflow tables.
-- Run inputs and message bodies are never read; outputs only when %(show_output)s is true.
-- The same text runs on every schema level from the protocol-1 baseline on.

--@name list
-- Newest first (started_at, then run_id, descending). Keyset pagination: with %(before)s (a run
-- id) only the runs that sort after it, i.e. started earlier. %(limit)s + 1 rows are read so
-- the caller knows whether there is another page.
SELECT r.run_id, r.flow_slug, r.status, r.started_at, r.completed_at, r.failed_at, r.remaining_steps,
       (SELECT pg_catalog.count(*)::integer FROM pgflow.step_states AS ss WHERE ss.run_id = r.run_id) AS steps,
       (SELECT pg_catalog.count(*)::integer FROM pgflow.step_states AS ss
         WHERE ss.run_id = r.run_id AND ss.status = 'failed') AS failed_steps
FROM pgflow.runs AS r
LEFT JOIN pgflow.runs AS b ON b.run_id = %(before)s::uuid
WHERE (%(flow)s::text IS NULL OR r.flow_slug = %(flow)s::text)
  AND (%(status)s::text IS NULL OR r.status = %(status)s::text)
  AND (%(before)s::uuid IS NULL OR (r.started_at, r.run_id) < (b.started_at, b.run_id))
ORDER BY r.started_at DESC, r.run_id DESC
LIMIT %(limit)s::integer + 1;

--@name flow_exists
SELECT EXISTS (SELECT 1 FROM pgflow.flows WHERE flow_slug = %(flow)s::text);

--@name run_exists
SELECT EXISTS (SELECT 1 FROM pgflow.runs WHERE run_id = %(run_id)s::uuid);

--@name runs_with_prefix
-- Run ids that start with a prefix (`runs show 3f2a`): the uuid range from the prefix padded with
-- 0s to it padded with fs, so the primary key answers however many runs there are.
SELECT r.run_id, r.flow_slug, r.status, r.started_at
FROM pgflow.runs AS r
WHERE r.run_id BETWEEN %(low)s::uuid AND %(high)s::uuid
ORDER BY r.run_id
LIMIT %(limit)s::integer;

--@name run
SELECT r.run_id, r.flow_slug, r.status, r.started_at, r.completed_at, r.failed_at, r.remaining_steps,
       CASE WHEN %(show_output)s::boolean THEN r.output END AS output
FROM pgflow.runs AS r
WHERE r.run_id = %(run_id)s::uuid;

--@name run_record
-- A run's lineage and its cancel's record (migration 0003: tables beside pgflow.runs, keyed by
-- run_id; NULL where there is none): one primary-key probe each.
SELECT rr.restart_of_run_id, rr.restart_kind, c.cancelled_at, c.reason AS cancel_reason, c.cancelled_by
FROM (SELECT %(run_id)s::uuid AS run_id) AS k
LEFT JOIN pgflow.run_restarts AS rr ON rr.run_id = k.run_id
LEFT JOIN pgflow.run_cancellations AS c ON c.run_id = k.run_id;

--@name has_run_operations
-- Whether this schema can cancel and restart runs (migration 0003).
SELECT pg_catalog.to_regprocedure('pgflow.cancel_run(uuid,text)') IS NOT NULL
       AND pg_catalog.to_regprocedure('pgflow.resume_run(uuid)') IS NOT NULL;

--@name has_restarts
-- Whether this schema records restarts and cancels (migration 0003: pgflow.run_restarts,
-- pgflow.run_cancellations).
SELECT pg_catalog.to_regclass('pgflow.run_restarts') IS NOT NULL
       AND pg_catalog.to_regclass('pgflow.run_cancellations') IS NOT NULL;

--@name restarted_as
-- The runs that restart this one (retry_run, resume_run), oldest first, at most 20.
SELECT r.run_id, rr.restart_kind, r.status, r.started_at
FROM pgflow.run_restarts AS rr
JOIN pgflow.runs AS r ON r.run_id = rr.run_id
WHERE rr.restart_of_run_id = %(run_id)s::uuid
ORDER BY r.started_at, r.run_id
LIMIT 20;

--@name in_flight
-- What a cancel would end: the run's queued and started tasks, manual ones counted apart.
SELECT pg_catalog.count(*) FILTER (WHERE t.status = 'queued')::integer AS queued,
       pg_catalog.count(*) FILTER (WHERE t.status = 'started'
                                   AND coalesce(pg_catalog.to_jsonb(t) ->> 'execution_mode', 'queue') = 'queue')::integer AS running,
       pg_catalog.count(*) FILTER (WHERE t.status = 'started'
                                   AND pg_catalog.to_jsonb(t) ->> 'execution_mode' = 'manual')::integer AS manual
FROM pgflow.step_tasks AS t
WHERE t.run_id = %(run_id)s::uuid AND t.status IN ('queued', 'started');

--@name cancel_record
-- Whether the run is cancelled, and how many of its tasks are (read before and after a cancel).
SELECT EXISTS (SELECT 1 FROM pgflow.run_cancellations AS c WHERE c.run_id = r.run_id) AS cancelled,
       (SELECT pg_catalog.count(*) FROM pgflow.step_tasks AS t
        WHERE t.run_id = r.run_id AND t.status = 'cancelled')::integer AS tasks_cancelled
FROM pgflow.runs AS r
WHERE r.run_id = %(run_id)s::uuid;

--@name restart_tasks
-- How a restarted run began: tasks reused from its source (completed with no attempt, resume_run)
-- and tasks queued or waiting (manual).
SELECT pg_catalog.count(*) FILTER (WHERE t.status = 'completed' AND t.attempts_count = 0)::integer AS reused,
       pg_catalog.count(*) FILTER (WHERE t.status IN ('queued', 'started'))::integer AS queued
FROM pgflow.step_tasks AS t
WHERE t.run_id = %(run_id)s::uuid;

--@name steps
-- The run's steps in definition order, with their options as they apply (step over flow).
SELECT ss.step_slug, s.step_index, s.step_type, ss.status, ss.initial_tasks, ss.remaining_tasks,
       ss.remaining_deps, ss.error_message, ss.skip_reason,
       ss.created_at, ss.started_at, ss.completed_at, ss.failed_at, ss.skipped_at,
       coalesce(s.opt_max_attempts, f.opt_max_attempts) AS max_attempts,
       coalesce(s.opt_timeout, f.opt_timeout) AS timeout_seconds,
       -- a completed step with no stored output (a run finished before an adoption of pgflow 0.8-0.12,
       -- history not filled): the output get_run_with_states computes from its tasks (migration 0003)
       CASE WHEN NOT %(show_output)s::boolean THEN NULL
            WHEN ss.output IS NULL AND ss.status = 'completed'
            THEN (SELECT e.value -> 'output'
                  FROM pg_catalog.jsonb_array_elements(pgflow.get_run_with_states(ss.run_id) -> 'steps') AS e
                  WHERE e.value ->> 'step_slug' = ss.step_slug)
            ELSE ss.output END AS output
FROM pgflow.step_states AS ss
JOIN pgflow.steps AS s ON s.flow_slug = ss.flow_slug AND s.step_slug = ss.step_slug
JOIN pgflow.flows AS f ON f.flow_slug = ss.flow_slug
WHERE ss.run_id = %(run_id)s::uuid
ORDER BY s.step_index, ss.step_slug;

--@name tasks
-- The run's tasks, at most %(max_tasks)s of them (by step, then index), and how many there are.
-- message_id is the PGMQ message's id, never its body.
SELECT t.step_slug, t.task_index, t.status, t.attempts_count, t.requeued_count, t.error_message,
       t.message_id, t.last_worker_id, t.queued_at, t.started_at, t.completed_at, t.failed_at,
       t.permanently_stalled_at,
       coalesce(pg_catalog.to_jsonb(t) ->> 'execution_mode', 'queue') AS execution_mode,
       coalesce((pg_catalog.to_jsonb(t) ->> 'refused_reports')::integer, 0) AS refused_reports,
       -- what the handler asked for with the latest failure (absent before schema 0003: NULL, false)
       (pg_catalog.to_jsonb(t) ->> 'requested_retry_delay')::integer AS requested_retry_delay,
       coalesce((pg_catalog.to_jsonb(t) ->> 'failed_now')::boolean, false) AS failed_now,
       CASE WHEN %(show_output)s::boolean THEN t.output END AS output,
       pg_catalog.count(*) OVER ()::integer AS total
FROM pgflow.step_tasks AS t
JOIN pgflow.steps AS s ON s.flow_slug = t.flow_slug AND s.step_slug = t.step_slug
WHERE t.run_id = %(run_id)s::uuid
ORDER BY s.step_index, t.step_slug, t.task_index
LIMIT %(max_tasks)s::integer;
--@end

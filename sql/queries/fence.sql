-- Queries of `pgflow fence` (docs/rollout.md). The writes are pgflow.fence_disable and
-- pgflow.fence_restore; everything else here only reads. Parameters: %(functions)s is a text[]
-- of worker function names, %(window)s the heartbeat window in seconds (a worker is live when
-- it has not stopped and its last heartbeat is younger than the window).

--@name installed
-- Whether this database has the fence record (migration 0003).
SELECT to_regclass('pgflow.fences') IS NOT NULL
       AND to_regprocedure('pgflow.fence_disable(text[], text)') IS NOT NULL
       AND to_regprocedure('pgflow.fence_restore(text[])') IS NOT NULL AS installed;

--@name known_flows
SELECT f.flow_slug FROM pgflow.flows AS f WHERE f.flow_slug = ANY (%(flows)s) ORDER BY 1;

--@name all_functions
SELECT wf.function_name FROM pgflow.worker_functions AS wf ORDER BY 1;

--@name functions_for_flows
-- Every worker function whose workers (any worker row, stopped ones included: a supervisor may
-- start them again) serve one of the flows' current routes.
SELECT DISTINCT w.function_name, w.flow_slug
FROM pgflow.workers AS w
JOIN pgflow.steps AS s
  ON s.flow_slug = w.flow_slug AND s.queue_name = w.queue_name
 AND (w.step_slug IS NULL OR w.step_slug = s.step_slug)
WHERE w.flow_slug = ANY (%(flows)s)
ORDER BY 1, 2;

--@name routes_of_functions
-- The routes (flow, step, queue) the functions' workers have served; step is NULL for a
-- whole-flow worker.
SELECT DISTINCT w.function_name, w.flow_slug, w.step_slug, w.queue_name
FROM pgflow.workers AS w
WHERE w.function_name = ANY (%(functions)s) AND w.flow_slug IS NOT NULL
ORDER BY 1, 2, 3 NULLS FIRST, 4;

--@name workers_to_deprecate
-- Workers fence_disable would deprecate (not stopped, not deprecated yet), for --dry-run and
-- the report; run in the same transaction before the call.
SELECT w.worker_id, w.function_name, w.flow_slug, w.step_slug, w.queue_name,
       extract(epoch FROM clock_timestamp() - w.last_heartbeat_at)::float8 AS heartbeat_age
FROM pgflow.workers AS w
WHERE w.function_name = ANY (%(functions)s) AND w.stopped_at IS NULL AND w.deprecated_at IS NULL
ORDER BY w.function_name, w.started_at, w.worker_id;

--@name disable
SELECT * FROM pgflow.fence_disable(%(functions)s, %(reason)s);

--@name restore
SELECT * FROM pgflow.fence_restore(%(functions)s);

--@name active_fences
-- Active fences (all, or of %(functions)s when not NULL) with their function row as it is now.
SELECT f.fence_id, f.function_name, f.previous_enabled, f.written_enabled, f.reason, f.fenced_at, f.fenced_by,
       f.fenced_application, f.fenced_client, f.workers_deprecated,
       extract(epoch FROM clock_timestamp() - f.fenced_at)::float8 AS age_seconds,
       wf.enabled, wf.paused_reason,
       pgflow._fence_holds(f, wf) AS holds
FROM pgflow.fences AS f
LEFT JOIN pgflow.worker_functions AS wf ON wf.function_name = f.function_name
WHERE f.state = 'active' AND (%(functions)s::text[] IS NULL OR f.function_name = ANY (%(functions)s))
ORDER BY f.function_name;

--@name live_workers
-- Workers of the functions still running: not stopped, heartbeat within the window.
SELECT w.worker_id, w.function_name, w.flow_slug, w.step_slug, w.queue_name,
       w.deprecated_at IS NOT NULL AS deprecated,
       extract(epoch FROM clock_timestamp() - w.last_heartbeat_at)::float8 AS heartbeat_age
FROM pgflow.workers AS w
WHERE w.function_name = ANY (%(functions)s) AND w.stopped_at IS NULL
  AND w.last_heartbeat_at > clock_timestamp() - make_interval(secs => %(window)s)
ORDER BY w.function_name, w.started_at, w.worker_id;

--@name started_tasks
-- Tasks the functions' workers started and that are still started. in_flight: the worker that
-- holds it heartbeats within the window (it may still finish it). Otherwise the task is
-- stranded: its worker died or gave up on it, and stalled recovery requeues it at recovery_at
-- (started_at + the effective timeout + 30 s). At most %(limit)s rows, in-flight first.
SELECT t.flow_slug, t.step_slug, t.run_id, t.task_index, t.queue_name, t.message_id, t.attempts_count,
       t.last_worker_id AS worker_id, w.function_name,
       extract(epoch FROM clock_timestamp() - t.started_at)::float8 AS started_seconds_ago,
       w.last_heartbeat_at > clock_timestamp() - make_interval(secs => %(window)s) AS in_flight,
       t.started_at + make_interval(secs => coalesce(s.opt_timeout, fl.opt_timeout) + 30) AS recovery_at
FROM pgflow.step_tasks AS t
JOIN pgflow.workers AS w ON w.worker_id = t.last_worker_id
JOIN pgflow.steps AS s ON s.flow_slug = t.flow_slug AND s.step_slug = t.step_slug
JOIN pgflow.flows AS fl ON fl.flow_slug = t.flow_slug
WHERE t.status = 'started' AND w.function_name = ANY (%(functions)s)
ORDER BY in_flight DESC, t.started_at, t.run_id, t.step_slug, t.task_index
LIMIT %(limit)s;

--@name started_by_step
-- Started tasks of the functions' workers per function, flow and step: in flight and stranded counts.
SELECT w.function_name, t.flow_slug, t.step_slug,
       count(*) FILTER (WHERE w.last_heartbeat_at > clock_timestamp() - make_interval(secs => %(window)s)) AS in_flight,
       count(*) FILTER (WHERE w.last_heartbeat_at <= clock_timestamp() - make_interval(secs => %(window)s)) AS stranded,
       extract(epoch FROM clock_timestamp() - min(t.started_at))::float8 AS oldest_seconds
FROM pgflow.step_tasks AS t
JOIN pgflow.workers AS w ON w.worker_id = t.last_worker_id
WHERE t.status = 'started' AND w.function_name = ANY (%(functions)s)
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3;

--@name backlog
-- Queued tasks waiting in the routes the functions' workers serve: the work the replacement
-- workers will pick up (queued tasks stay queued durably while nobody polls).
SELECT t.flow_slug, t.step_slug, t.queue_name, count(*) AS queued,
       extract(epoch FROM clock_timestamp() - min(t.queued_at))::float8 AS oldest_seconds
FROM pgflow.step_tasks AS t
WHERE t.status = 'queued'
  AND (t.flow_slug, t.queue_name) IN (SELECT w.flow_slug, w.queue_name FROM pgflow.workers AS w
                                      WHERE w.function_name = ANY (%(functions)s))
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3;

--@name new_workers
-- Workers of the functions that registered or heartbeat at or after %(since)s and are running
-- normally (not deprecated, not stopped, heartbeat within the window): proof that the
-- replacement code runs.
SELECT w.worker_id, w.function_name, w.flow_slug, w.step_slug, w.queue_name,
       extract(epoch FROM clock_timestamp() - w.last_heartbeat_at)::float8 AS heartbeat_age
FROM pgflow.workers AS w
WHERE w.function_name = ANY (%(functions)s) AND w.deprecated_at IS NULL AND w.stopped_at IS NULL
  AND w.last_heartbeat_at >= %(since)s
  AND w.last_heartbeat_at > clock_timestamp() - make_interval(secs => %(window)s)
ORDER BY w.function_name, w.started_at, w.worker_id;
--@end

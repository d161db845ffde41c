-- pgflow._drop_flow_activity(flow_slug): is anything still working on the flow? The one rule both
-- the plan (pgflow.drop_flow_plan) and the deletion's recheck under its locks (pgflow.drop_flow) use.
--
-- Workers of the flow are its pgflow.workers rows (workers.flow_slug). Each is
--   stopped   stopped_at is set;
--   stale     no heartbeat for 30 seconds (the liveness window `pgflow migrate` uses too);
--   draining  alive, but told to stop (deprecated_at) or its function is fenced;
--   live      alive and serving.
-- The flow's functions are the worker_functions rows its workers name; the flow is fenced when it
-- has at least one and every one is disabled (worker_functions.enabled = false). It is drained
-- when no task is in flight (started and not permanently stalled) and no live worker is left.
--
-- Deletion is allowed without force when no live worker serves the flow and no run is started,
-- or when the flow is fenced and drained (its started runs are then abandoned on purpose).
--
-- Returns jsonb: {"runs": {"started", "completed", "failed"}, "in_flight_tasks", "workers": [{
-- "worker_id", "function_name", "queue_name", "step_slug", "state", "last_heartbeat_at",
-- "seconds_since_heartbeat", "deprecated_at", "stopped_at"}], "functions": [{"function_name",
-- "enabled"}], "live_workers", "draining_workers", "stale_workers", "fenced", "drained",
-- "allowed", "blockers": [text]}. Never task inputs, outputs or message bodies.
CREATE OR REPLACE FUNCTION pgflow._drop_flow_activity(flow_slug text)
RETURNS jsonb
LANGUAGE sql
STABLE
SET search_path = ''
AS $$
  WITH runs AS (
    SELECT pg_catalog.count(*) FILTER (WHERE r.status = 'started') AS started,
           pg_catalog.count(*) FILTER (WHERE r.status = 'completed') AS completed,
           pg_catalog.count(*) FILTER (WHERE r.status = 'failed') AS failed
    FROM pgflow.runs AS r WHERE r.flow_slug = _drop_flow_activity.flow_slug
  ), in_flight AS (
    SELECT pg_catalog.count(*) AS n FROM pgflow.step_tasks AS t
    WHERE t.flow_slug = _drop_flow_activity.flow_slug AND t.status = 'started' AND t.permanently_stalled_at IS NULL
  ), functions AS (
    SELECT wf.function_name, coalesce(wf.enabled, true) AS enabled
    FROM (SELECT DISTINCT w.function_name FROM pgflow.workers AS w WHERE w.flow_slug = _drop_flow_activity.flow_slug) AS fn
    LEFT JOIN pgflow.worker_functions AS wf ON wf.function_name = fn.function_name
  ), workers AS (
    SELECT w.*,
           CASE
             WHEN w.stopped_at IS NOT NULL THEN 'stopped'
             WHEN w.last_heartbeat_at < pg_catalog.clock_timestamp() - interval '30 seconds' THEN 'stale'
             WHEN w.deprecated_at IS NOT NULL
                  OR EXISTS (SELECT 1 FROM pgflow.worker_functions AS wf
                             WHERE wf.function_name = w.function_name AND NOT wf.enabled) THEN 'draining'
             ELSE 'live'
           END AS state
    FROM pgflow.workers AS w WHERE w.flow_slug = _drop_flow_activity.flow_slug
  ), counts AS (
    SELECT (SELECT pg_catalog.count(*) FROM workers WHERE state = 'live') AS live,
           (SELECT pg_catalog.count(*) FROM workers WHERE state = 'draining') AS draining,
           (SELECT pg_catalog.count(*) FROM workers WHERE state IN ('stale', 'stopped')) AS stale,
           EXISTS (SELECT 1 FROM functions) AND NOT EXISTS (SELECT 1 FROM functions WHERE enabled) AS fenced,
           (SELECT runs.started FROM runs) AS started,
           (SELECT in_flight.n FROM in_flight) AS in_flight
  ), verdict AS (
    SELECT c.*,
           c.live = 0 AND c.in_flight = 0 AS drained,
           (c.live = 0 AND c.started = 0) OR (c.fenced AND c.live = 0 AND c.in_flight = 0) AS allowed
    FROM counts AS c
  )
  SELECT pg_catalog.jsonb_build_object(
    'runs', (SELECT pg_catalog.jsonb_build_object('started', runs.started, 'completed', runs.completed, 'failed', runs.failed) FROM runs),
    'in_flight_tasks', v.in_flight,
    'workers', coalesce((SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                  'worker_id', w.worker_id, 'function_name', w.function_name, 'queue_name', w.queue_name,
                  'step_slug', w.step_slug, 'state', w.state, 'last_heartbeat_at', w.last_heartbeat_at,
                  'seconds_since_heartbeat',
                  pg_catalog.round(EXTRACT(epoch FROM pg_catalog.clock_timestamp() - w.last_heartbeat_at)::numeric, 1),
                  'deprecated_at', w.deprecated_at, 'stopped_at', w.stopped_at)
                ORDER BY w.state, w.function_name, w.worker_id) FROM workers AS w), '[]'::jsonb),
    'functions', coalesce((SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('function_name', f.function_name, 'enabled', f.enabled)
                  ORDER BY f.function_name) FROM functions AS f), '[]'::jsonb),
    'live_workers', v.live,
    'draining_workers', v.draining,
    'stale_workers', v.stale,
    'fenced', v.fenced,
    'drained', v.drained,
    'allowed', v.allowed,
    'blockers', CASE WHEN v.allowed THEN '[]'::jsonb ELSE pg_catalog.to_jsonb(pg_catalog.array_remove(ARRAY[
        CASE WHEN v.live > 0 THEN pg_catalog.format('%s live worker(s) serve the flow', v.live) END,
        CASE WHEN v.started > 0 THEN pg_catalog.format('%s run(s) are still started', v.started) END,
        CASE WHEN v.in_flight > 0 THEN pg_catalog.format('%s task(s) are in flight (started)', v.in_flight) END,
        CASE WHEN NOT v.fenced THEN 'the flow is not fenced (worker_functions.enabled = false on every function of its workers)' END
      ], NULL)) END
  )
  FROM verdict AS v
$$;

REVOKE ALL ON FUNCTION pgflow._drop_flow_activity(text) FROM PUBLIC;

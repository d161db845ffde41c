-- pgflow workers list / forget: the worker rows themselves (docs/commands/workers.md).
-- Liveness and route attribution are the fragments `pgflow status` and `pgflow coverage` use.
-- Parameters: %(heartbeat_window)s seconds (liveness); %(flow)s text, one exact flow slug or NULL
-- (a worker belongs to a flow when it serves one of its routes or registered that flow);
-- %(stale_for)s seconds or NULL (only rows without a heartbeat for at least that long).
-- Runs on every schema level from the baseline on.

--@name list
-- One row per worker row, those that most need a look first: stale, then draining, live, stopped.
-- tasks_in_flight: started tasks it claimed last that stalled recovery has not given up on.
WITH routes_x AS (
--@include fragments/routes.sql
), workers_x AS (
--@include fragments/workers.sql
), served AS (
--@include fragments/worker_routes.sql
), in_flight AS (
  SELECT t.last_worker_id AS worker_id, pg_catalog.count(*)::integer AS tasks
  FROM pgflow.step_tasks AS t
  WHERE t.status = 'started' AND t.permanently_stalled_at IS NULL AND t.last_worker_id IS NOT NULL
  GROUP BY t.last_worker_id
)
SELECT w.worker_id, w.function_name, w.flow_slug, w.step_slug, w.queue_name, w.worker_version,
       CASE WHEN w.stopped_at IS NOT NULL THEN 'stopped' WHEN w.live THEN 'live'
            WHEN w.draining THEN 'draining' ELSE 'stale' END AS state,
       w.started_at, w.last_heartbeat_at, w.stopped_at,
       pg_catalog.round(extract(epoch FROM pg_catalog.clock_timestamp() - w.last_heartbeat_at)::numeric, 3)::float8
         AS heartbeat_age_seconds,
       coalesce(f.tasks, 0) AS tasks_in_flight,
       coalesce((SELECT pg_catalog.array_agg(sv.flow_slug || coalesce('/' || sv.step_slug, '')
                                             ORDER BY sv.flow_slug, sv.step_slug)
                 FROM served AS sv WHERE sv.worker_id = w.worker_id), '{}') AS serves
FROM workers_x AS w
LEFT JOIN in_flight AS f ON f.worker_id = w.worker_id
WHERE (%(flow)s::text IS NULL OR w.flow_slug = %(flow)s::text
       OR EXISTS (SELECT 1 FROM served AS sv WHERE sv.worker_id = w.worker_id AND sv.flow_slug = %(flow)s::text))
  AND (%(stale_for)s::double precision IS NULL
       OR w.last_heartbeat_at < pg_catalog.clock_timestamp()
                                - pg_catalog.make_interval(secs => %(stale_for)s::double precision))
ORDER BY CASE WHEN w.stopped_at IS NOT NULL THEN 3 WHEN w.live THEN 2 WHEN w.draining THEN 1 ELSE 0 END,
         w.last_heartbeat_at, w.worker_id

--@name lock_forgettable
-- First statement of `forget` (in its transaction): lock the candidate rows (%(worker_ids)s, read
-- by `list` with the same filters) that still have no heartbeat for %(stale_for)s seconds. A row
-- whose worker heartbeat meanwhile is re-read under the lock and left out; from here on no claim
-- can name a locked worker (its foreign-key check waits for the lock), so the next statement,
-- with a snapshot taken after the locks, sees every task such a worker holds.
SELECT w.worker_id
FROM pgflow.workers AS w
WHERE w.worker_id = ANY (%(worker_ids)s::uuid[])
  AND w.last_heartbeat_at < pg_catalog.clock_timestamp()
                            - pg_catalog.make_interval(secs => %(stale_for)s::double precision)
ORDER BY w.worker_id
FOR UPDATE OF w

--@name forget
-- Second statement of `forget`: delete the locked rows
-- that hold no task in flight (started and not given up by stalled recovery). Finished tasks that
-- name a deleted worker keep their row; their last_worker_id becomes NULL (the foreign key's rule).
DELETE FROM pgflow.workers AS w
WHERE w.worker_id = ANY (%(worker_ids)s::uuid[])
  AND NOT EXISTS (SELECT 1 FROM pgflow.step_tasks AS t
                  WHERE t.last_worker_id = w.worker_id AND t.status = 'started' AND t.permanently_stalled_at IS NULL)
RETURNING w.worker_id
--@end

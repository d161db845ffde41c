-- Fragment: pgflow.workers with the liveness rule every report uses (`pgflow status`, `pgflow
-- coverage`, `pgflow workers list`). Parameter %(heartbeat_window)s: seconds.
-- Output: the worker row's columns, worker_version (NULL where the column does not exist yet) and
--   live      heartbeat within the window, not deprecated, not stopped;
--   draining  deprecated (told to stop), still heartbeating within the window;
--   stale     not stopped and no heartbeat within the window (killed, or hung).
SELECT w.worker_id, w.queue_name, w.function_name, w.flow_slug, w.step_slug, w.started_at,
       w.last_heartbeat_at, w.deprecated_at, w.stopped_at,
       pg_catalog.to_jsonb(w) ->> 'worker_version' AS worker_version,
       w.stopped_at IS NULL AND w.deprecated_at IS NULL AND w.last_heartbeat_at >= h.since AS live,
       w.stopped_at IS NULL AND w.deprecated_at IS NOT NULL AND w.last_heartbeat_at >= h.since AS draining,
       w.stopped_at IS NULL AND w.last_heartbeat_at < h.since AS stale
FROM pgflow.workers AS w
CROSS JOIN (SELECT pg_catalog.clock_timestamp()
                   - pg_catalog.make_interval(secs => %(heartbeat_window)s::double precision) AS since) AS h

-- Fragment of sql/queries/coverage.sql: the CTEs both coverage statements read.
-- all_routes(flow_slug, step_slug, step_index, queue_mode, queue_name): every persisted route;
-- selected_routes: those of the flows filter (all when it is NULL);
-- workers_x: worker rows with worker_version (NULL where the column does not exist) and their
-- liveness against the heartbeat window; pgmq_rel: the PGMQ tables.
all_routes AS (
  SELECT f.flow_slug, NULL::text AS step_slug, NULL::integer AS step_index, f.queue_mode,
         pg_catalog.lower(f.flow_slug COLLATE "C") AS queue_name
  FROM pgflow.flows AS f
  WHERE f.queue_mode = 'flow'
  UNION ALL
  SELECT s.flow_slug, s.step_slug, s.step_index, f.queue_mode, s.queue_name
  FROM pgflow.steps AS s
  JOIN pgflow.flows AS f ON f.flow_slug = s.flow_slug
  WHERE f.queue_mode = 'step'
), selected_routes AS (
  SELECT r.* FROM all_routes AS r
  WHERE %(flows)s::text[] IS NULL OR r.flow_slug = ANY (%(flows)s::text[])
), workers_x AS (
  SELECT w.worker_id, w.queue_name, w.function_name, w.flow_slug, w.step_slug, w.started_at,
         w.last_heartbeat_at, w.deprecated_at, w.stopped_at,
         pg_catalog.to_jsonb(w) ->> 'worker_version' AS worker_version,
         w.stopped_at IS NULL AND w.deprecated_at IS NULL AND w.last_heartbeat_at >= h.since AS live,
         w.stopped_at IS NULL AND w.deprecated_at IS NOT NULL AND w.last_heartbeat_at >= h.since AS draining,
         w.stopped_at IS NULL AND w.last_heartbeat_at < h.since AS stale
  FROM pgflow.workers AS w
  CROSS JOIN (SELECT pg_catalog.clock_timestamp()
                     - pg_catalog.make_interval(secs => %(heartbeat_window)s::double precision) AS since) AS h
), pgmq_rel AS (
  SELECT c.oid, c.relname::text AS relname
  FROM pg_catalog.pg_class AS c
  JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
  WHERE n.nspname = 'pgmq' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
)

-- pgflow coverage: every persisted route (flow, step, queue) against the live worker rows
-- (spec "Worker coverage"; docs/coverage.md). Read-only: USAGE on the schemas pgflow and pgmq
-- and SELECT on their tables suffice; nothing but built-in functions is called.
--
-- Parameters: %(heartbeat_window)s numeric seconds (a worker is live when its last heartbeat
-- is at most this old); %(flows)s text[] of exact flow slugs, or NULL for every flow.
-- `pgflow coverage --sql` prints both statements with the parameters filled in, for psql.
--
-- A route is a plain flow (step NULL, queue lower(flow_slug), served by whole-flow workers) or
-- one step of a step-queued flow (its persisted private queue, served by step workers). Which
-- routes a worker row serves is fragments/worker_routes.sql, the rule `pgflow status` uses too.
-- Stopped rows never count. Columns that later migrations add (flows.queue_mode, steps.queue_name,
-- workers.worker_version) are read through to_jsonb(row), so the same text runs on every schema
-- level from the baseline on (a missing version is NULL).

--@name routes
-- One row per route, in flow and step order. state, first that applies:
--   queue_missing  the route's PGMQ queue table does not exist
--   covered        at least one live worker: heartbeat within the window, not deprecated
--   draining       only deprecated workers that still heartbeat (finishing their tasks)
--   fenced         no live worker and a function that served the route is disabled
--   stale          only workers that stopped heartbeating without stopping (killed)
--   uncovered      no worker row at all
-- work_waiting: not covered and messages are waiting in the queue.
WITH
--@include fragments/coverage_sources.sql
, per_route AS (
  SELECT r.flow_slug, r.step_slug, r.step_index, r.queue_mode, r.queue_name,
         pg_catalog.count(w.worker_id) FILTER (WHERE w.live) AS live_workers,
         coalesce(pg_catalog.array_agg(DISTINCT coalesce(w.worker_version, '(not reported)'))
                    FILTER (WHERE w.live), '{}') AS live_versions,
         pg_catalog.count(w.worker_id) FILTER (WHERE w.draining) AS draining_workers,
         coalesce(pg_catalog.array_agg(DISTINCT coalesce(w.worker_version, '(not reported)'))
                    FILTER (WHERE w.draining), '{}') AS draining_versions,
         pg_catalog.count(w.worker_id) FILTER (WHERE w.stale) AS stale_workers,
         pg_catalog.max(w.last_heartbeat_at) AS last_heartbeat_at
  FROM selected_routes AS r
  LEFT JOIN (served AS sv JOIN workers_x AS w ON w.worker_id = sv.worker_id AND w.stopped_at IS NULL)
    ON sv.flow_slug = r.flow_slug AND sv.step_slug IS NOT DISTINCT FROM r.step_slug
  GROUP BY r.flow_slug, r.step_slug, r.step_index, r.queue_mode, r.queue_name
), route_functions AS (
  -- every function that ever registered a worker for the route (stopped rows included)
  SELECT r.flow_slug, r.step_slug,
         pg_catalog.array_agg(DISTINCT w.function_name ORDER BY w.function_name) AS functions,
         pg_catalog.array_agg(DISTINCT w.function_name ORDER BY w.function_name)
           FILTER (WHERE wf.enabled IS FALSE) AS fenced_functions
  FROM selected_routes AS r
  JOIN served AS sv ON sv.flow_slug = r.flow_slug AND sv.step_slug IS NOT DISTINCT FROM r.step_slug
  JOIN workers_x AS w ON w.worker_id = sv.worker_id
  LEFT JOIN pgflow.worker_functions AS wf ON wf.function_name = w.function_name
  GROUP BY r.flow_slug, r.step_slug
), queue_stats AS (
  SELECT k.queue_name,
         qt.oid IS NOT NULL AS queue_exists,
         qt.oid IS NOT NULL AND pg_catalog.has_table_privilege(qt.oid, 'SELECT') AS queue_readable,
         CASE WHEN qt.oid IS NOT NULL AND pg_catalog.has_table_privilege(qt.oid, 'SELECT') THEN
           pg_catalog.query_to_xml(
             pg_catalog.format('SELECT count(*) AS messages, count(*) FILTER (WHERE vt <= clock_timestamp()) AS visible, '
                               || 'round(extract(epoch FROM clock_timestamp() - min(enqueued_at))::numeric, 3) AS oldest_age '
                               || 'FROM pgmq.%%I', qt.relname),
             false, true, '')
         END AS stats
  FROM (SELECT DISTINCT queue_name FROM selected_routes) AS k
  LEFT JOIN pgmq_rel AS qt ON qt.relname = ('q_' || pg_catalog.lower(k.queue_name))::name::text
)
SELECT p.flow_slug,
       p.step_slug,
       p.step_index,
       p.queue_mode,
       p.queue_name,
       CASE WHEN NOT q.queue_exists THEN 'queue_missing'
            WHEN p.live_workers > 0 THEN 'covered'
            WHEN p.draining_workers > 0 THEN 'draining'
            WHEN rf.fenced_functions IS NOT NULL THEN 'fenced'
            WHEN p.stale_workers > 0 THEN 'stale'
            ELSE 'uncovered'
       END AS state,
       p.live_workers::integer AS live_workers,
       p.live_versions,
       p.draining_workers::integer AS draining_workers,
       p.draining_versions,
       p.stale_workers::integer AS stale_workers,
       p.last_heartbeat_at,
       coalesce(rf.functions, '{}') AS functions,
       coalesce(rf.fenced_functions, '{}') AS fenced_functions,
       q.queue_exists,
       q.queue_readable,
       (pg_catalog.xpath('/row/messages/text()', q.stats))[1]::text::bigint AS backlog,
       (pg_catalog.xpath('/row/visible/text()', q.stats))[1]::text::bigint AS visible_messages,
       (pg_catalog.xpath('/row/oldest_age/text()', q.stats))[1]::text::numeric AS oldest_message_age_seconds,
       (p.live_workers = 0 AND coalesce((pg_catalog.xpath('/row/messages/text()', q.stats))[1]::text::bigint, 0) > 0)
         AS work_waiting
FROM per_route AS p
JOIN queue_stats AS q ON q.queue_name = p.queue_name
LEFT JOIN route_functions AS rf ON rf.flow_slug = p.flow_slug AND rf.step_slug IS NOT DISTINCT FROM p.step_slug
ORDER BY p.flow_slug, p.step_index NULLS FIRST

--@name unowned_workers
-- Live or draining workers (heartbeat within the window, not stopped) whose (flow, step, queue)
-- matches no persisted route: a worker of a deleted or renamed flow, or a queue nobody routes to.
-- With a flow filter, only workers naming one of those flows (or no flow) are listed.
WITH
--@include fragments/coverage_sources.sql
SELECT w.worker_id,
       w.function_name,
       w.queue_name,
       w.flow_slug,
       w.step_slug,
       w.worker_version,
       w.last_heartbeat_at,
       w.deprecated_at IS NOT NULL AS deprecated
FROM workers_x AS w
WHERE w.stopped_at IS NULL
  AND (w.live OR w.draining)
  AND (%(flows)s::text[] IS NULL OR w.flow_slug IS NULL OR w.flow_slug = ANY (%(flows)s::text[]))
  AND NOT EXISTS (SELECT 1 FROM served AS sv WHERE sv.worker_id = w.worker_id)
ORDER BY w.queue_name, w.worker_id

--@name known_flows
-- Which of the requested flow slugs exist (a --flow naming no flow is refused, or waited for).
SELECT pg_catalog.array_agg(f.flow_slug ORDER BY f.flow_slug) AS flows
FROM pgflow.flows AS f
WHERE f.flow_slug = ANY (%(flows)s::text[])
--@end

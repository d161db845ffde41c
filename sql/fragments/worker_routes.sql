-- Fragment: the routes each worker row serves: the one matching rule of `pgflow status`,
-- `pgflow coverage` and `pgflow workers list` (and of anything else that attributes workers).
-- Input relations: workers_x (fragments/workers.sql) and routes_x (fragments/routes.sql).
-- Output: (worker_id, flow_slug, step_slug, queue_name): one row per worker and route it serves.
-- A worker serves a route when it polls the route's PGMQ table and, when it registered a flow,
-- that flow and step. The table is compared as PGMQ derives it from a queue name
-- ('q_' || lower(name), cut to the 63-byte identifier limit), so a worker that registered the
-- queue in another letter case (a pre-upgrade 'MyFlow') serves the route of queue 'myflow':
-- it reads the same messages. A worker registered without a flow serves every route on its table.
SELECT w.worker_id, r.flow_slug, r.step_slug, r.queue_name
FROM workers_x AS w
JOIN routes_x AS r
  ON ('q_' || pg_catalog.lower(w.queue_name))::name::text = ('q_' || pg_catalog.lower(r.queue_name))::name::text
 AND (w.flow_slug IS NULL OR (w.flow_slug = r.flow_slug AND w.step_slug IS NOT DISTINCT FROM r.step_slug))

-- Fragment of sql/queries/coverage.sql: the CTEs both coverage statements read.
-- routes_x: every persisted route (fragments/routes.sql);
-- selected_routes: those of the flows filter (all when it is NULL);
-- workers_x: worker rows and their liveness against the heartbeat window (fragments/workers.sql);
-- served: which routes each worker serves (fragments/worker_routes.sql, the rule status shares);
-- pgmq_rel: the PGMQ tables.
routes_x AS (
--@include fragments/routes.sql
), selected_routes AS (
  SELECT r.* FROM routes_x AS r
  WHERE %(flows)s::text[] IS NULL OR r.flow_slug = ANY (%(flows)s::text[])
), workers_x AS (
--@include fragments/workers.sql
), served AS (
--@include fragments/worker_routes.sql
), pgmq_rel AS (
  SELECT c.oid, c.relname::text AS relname
  FROM pg_catalog.pg_class AS c
  JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
  WHERE n.nspname = 'pgmq' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
)

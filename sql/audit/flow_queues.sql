-- Fragment: the queues each flow uses. Input relations: flows_x (audit/flows.sql) and
-- steps_x (audit/steps.sql). Output: (flow_slug, queue_name, origin, q_table).
-- origin 'default': lower(flow_slug) for a flow in flow mode (every flow before the
-- private-step-queue release); origin 'step': a persisted step route that differs from it.
-- q_table is the PGMQ queue table as PGMQ derives it ('q_' || lower(name), default
-- collation), cut to the 63-byte identifier limit exactly as PostgreSQL cuts it.
SELECT fq.flow_slug,
       fq.queue_name,
       fq.origin,
       ('q_' || lower(fq.queue_name))::name::text AS q_table
FROM (
  SELECT fx.flow_slug, fx.default_queue AS queue_name, 'default' AS origin
  FROM flows_x AS fx
  WHERE fx.queue_mode <> 'step'
  UNION
  SELECT sx.flow_slug, sx.queue_name, 'step'
  FROM steps_x AS sx
  JOIN flows_x AS fx ON fx.flow_slug = sx.flow_slug
  WHERE sx.queue_name IS NOT NULL
    AND (fx.queue_mode = 'step' OR sx.queue_name <> fx.default_queue)
) AS fq

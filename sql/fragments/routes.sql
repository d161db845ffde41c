-- Fragment: every persisted route, on every schema level (the baseline has neither
-- flows.queue_mode nor steps.queue_name nor steps.execution_mode: they are read through
-- to_jsonb(row), absent meaning a plain flow's shared queue).
-- Output: (flow_slug, step_slug, step_index, queue_mode, queue_name).
-- A plain flow is one route (step_slug NULL) on lower(flow_slug); each step of a step-queued flow
-- is a route on its persisted private queue, except a manual step, which has no queue and no worker.
SELECT f.flow_slug, NULL::text AS step_slug, NULL::integer AS step_index, 'flow'::text AS queue_mode,
       pg_catalog.lower(f.flow_slug COLLATE "C") AS queue_name
FROM pgflow.flows AS f
WHERE coalesce(pg_catalog.to_jsonb(f) ->> 'queue_mode', 'flow') <> 'step'
UNION ALL
SELECT s.flow_slug, s.step_slug, s.step_index, 'step'::text, pg_catalog.to_jsonb(s) ->> 'queue_name'
FROM pgflow.steps AS s
JOIN pgflow.flows AS f ON f.flow_slug = s.flow_slug
WHERE pg_catalog.to_jsonb(f) ->> 'queue_mode' = 'step'
  AND pg_catalog.to_jsonb(s) ->> 'execution_mode' IS DISTINCT FROM 'manual'

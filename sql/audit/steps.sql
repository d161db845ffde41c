-- Fragment: pgflow.steps as the audit sees it, on every schema generation.
-- Output: (flow_slug text, step_slug text, step_index integer, queue_name text).
-- queue_name (the persisted route) arrives with the queue-identity migration; NULL before.
--
-- Optional column (as in audit/flows.sql): the unqualified queue_name is pgflow.steps' column
-- where it exists, else the NULL of `absent` one query level out.
SELECT x.flow_slug, x.step_slug, x.step_index, x.queue_name
FROM (SELECT NULL::text AS queue_name) AS absent
CROSS JOIN LATERAL (
  SELECT s.flow_slug,
         s.step_slug,
         s.step_index,
         queue_name::text AS queue_name
  FROM pgflow.steps AS s
) AS x

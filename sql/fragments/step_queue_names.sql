-- Fragment: generated private step queue names (authoritative; mirrored by pgflow_cli.naming).
-- Input relation: route_input(flow_slug text, step_slug text, step_index integer),
-- slugs already known to be valid and step_index >= 0.
-- Output: (flow_slug, step_slug, step_index, queue_name text, name_kind text, reason text).
-- readable name lower(flow__step) when it fits 47 characters, else lower(flow__index),
-- else queue_name NULL with reason 'queue_name_too_long'. Never truncated or hashed.
SELECT ri.flow_slug,
       ri.step_slug,
       ri.step_index,
       CASE WHEN length(n.readable) <= 47 THEN n.readable
            WHEN length(n.fallback) <= 47 THEN n.fallback
       END AS queue_name,
       CASE WHEN length(n.readable) <= 47 THEN 'readable'
            WHEN length(n.fallback) <= 47 THEN 'index'
       END AS name_kind,
       CASE WHEN length(n.readable) <= 47 OR length(n.fallback) <= 47 THEN NULL
            ELSE 'queue_name_too_long'
       END AS reason
FROM route_input AS ri
CROSS JOIN LATERAL (
  SELECT lower((ri.flow_slug || '__' || ri.step_slug) COLLATE "C") AS readable,
         lower((ri.flow_slug || '__' || ri.step_index::text) COLLATE "C") AS fallback
) AS n

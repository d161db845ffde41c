-- Fragment: pgflow.steps as the audit sees it, on every schema generation.
-- Output: (flow_slug text, step_slug text, step_index integer, queue_name text).
-- queue_name (the persisted route) arrives with the queue-identity migration; NULL before.
SELECT s.flow_slug,
       s.step_slug,
       s.step_index,
       to_jsonb(s) ->> 'queue_name' AS queue_name
FROM pgflow.steps AS s

-- Fragment: pgflow.flows as the audit sees it, on every schema generation.
-- Output: (flow_slug text, queue_mode text, default_queue text).
-- queue_mode arrives with private step queues (absent = 'flow'); default_queue is the queue a
-- plain flow uses from the queue-identity release on: lower(flow_slug), ASCII-only lowering.
SELECT f.flow_slug,
       coalesce(to_jsonb(f) ->> 'queue_mode', 'flow') AS queue_mode,
       (lower(f.flow_slug COLLATE "C") COLLATE "default") AS default_queue
FROM pgflow.flows AS f

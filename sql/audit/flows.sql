-- Fragment: pgflow.flows as the audit sees it, on every schema generation.
-- Output: (flow_slug text, queue_mode text, default_queue text).
-- queue_mode arrives with private step queues (absent = 'flow'); default_queue is the queue a
-- plain flow uses from the queue-identity release on: lower(flow_slug), ASCII-only lowering.
--
-- Optional column, read without converting every row: the unqualified name queue_mode is
-- resolved innermost first, so it is pgflow.flows' column where the table has one, and else the
-- NULL of the one-row relation `absent` one query level out (a LATERAL reference, no ambiguity:
-- the two are at different levels). The same text parses on every schema.
SELECT x.flow_slug, x.queue_mode, x.default_queue
FROM (SELECT NULL::text AS queue_mode) AS absent
CROSS JOIN LATERAL (
  SELECT f.flow_slug,
         coalesce(queue_mode::text, 'flow') AS queue_mode,
         (lower(f.flow_slug COLLATE "C") COLLATE "default") AS default_queue
  FROM pgflow.flows AS f
) AS x

-- pgflow._drop_flow_route(flow_slug): the queues whole-flow deletion would drop, one row per queue,
-- with every reason it may not (spec "Generated private ownership", "Queue identity").
--
-- A flow owns exactly its generated private route and nothing else: lower(flow_slug) for a plain
-- flow (queue_mode 'flow'), pgflow.step_queue_name(flow, step, index) for each step of a
-- step-queued flow (queue_mode 'step'). Queues named by the flow's task snapshots are listed too,
-- so a task outside the route is seen (and refused) rather than left behind. No rows for an
-- unknown flow.
--
-- Columns:
--   queue_name     the canonical (lowercase) queue name
--   origins        where it comes from: 'default', 'step:<slug>', 'tasks'
--   listed_as      the exact pgmq.meta spelling (NULL when no meta row lists it)
--   listings       how many pgmq.meta rows map to its tables (their names equal ignoring case)
--   q_table        the queue table (regclass, NULL when it does not exist)
--   a_table        the archive table (regclass, NULL when it does not exist)
--   table_owner    owner of the queue (else archive) table; dropping it is this role's right
--   problems       why the queue must not be dropped; empty when it is this flow's alone
--
-- Read-only; takes no locks beyond ordinary reads. Callers that act on the answer hold the flow
-- locks (pgflow.drop_flow).
CREATE OR REPLACE FUNCTION pgflow._drop_flow_route(flow_slug text)
RETURNS TABLE (
  queue_name text,
  origins text[],
  listed_as text,
  listings integer,
  q_table regclass,
  a_table regclass,
  table_owner name,
  problems text[]
)
LANGUAGE sql
STABLE
SET search_path = ''
AS $$
  WITH flow AS (
    SELECT f.flow_slug, f.queue_mode FROM pgflow.flows AS f WHERE f.flow_slug = _drop_flow_route.flow_slug
  ), expected AS (
    -- the generated route: one row per step (and the default queue of a plain flow)
    SELECT pg_catalog.lower(flow.flow_slug COLLATE "C") AS queue_name, 'default'::text AS origin, NULL::text AS problem
    FROM flow WHERE flow.queue_mode = 'flow'
    UNION ALL
    SELECT s.queue_name,
           'step:' || s.step_slug,
           CASE
             WHEN flow.queue_mode = 'flow' AND s.queue_name IS DISTINCT FROM pg_catalog.lower(flow.flow_slug COLLATE "C")
               THEN pg_catalog.format('step "%s" routes to queue "%s", not to the flow''s default queue "%s": not a generated private queue',
                                      s.step_slug, s.queue_name, pg_catalog.lower(flow.flow_slug COLLATE "C"))
             WHEN flow.queue_mode = 'step'
                  AND s.queue_name IS DISTINCT FROM pgflow.step_queue_name(flow.flow_slug, s.step_slug, s.step_index)
               THEN pg_catalog.format('step "%s" routes to queue "%s", not to its generated private queue "%s"',
                                      s.step_slug, s.queue_name, pgflow.step_queue_name(flow.flow_slug, s.step_slug, s.step_index))
           END
    FROM pgflow.steps AS s JOIN flow ON flow.flow_slug = s.flow_slug
  ), snapshot AS (
    -- queues the flow's tasks live in that its route does not name (should never exist)
    SELECT DISTINCT t.queue_name, 'tasks'::text AS origin,
           pg_catalog.format('tasks of this flow are in queue "%s", which is not on its route', t.queue_name) AS problem
    FROM pgflow.step_tasks AS t
    WHERE t.flow_slug = _drop_flow_route.flow_slug
      AND t.queue_name <> ALL (ARRAY(SELECT e.queue_name FROM expected AS e))
  ), named AS (
    SELECT e.queue_name, e.origin, e.problem FROM expected AS e
    UNION ALL
    SELECT sn.queue_name, sn.origin, sn.problem FROM snapshot AS sn
  ), queues AS (
    SELECT n.queue_name,
           pg_catalog.array_agg(n.origin ORDER BY n.origin) AS origins,
           pg_catalog.array_remove(pg_catalog.array_agg(n.problem ORDER BY n.origin), NULL) AS own_problems
    FROM named AS n
    GROUP BY n.queue_name
  ), physical AS (
    SELECT q.*,
           meta.spellings,
           pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', pgmq.format_table_name(q.queue_name, 'q'))) AS q_reg,
           pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', pgmq.format_table_name(q.queue_name, 'a'))) AS a_reg
    FROM queues AS q
    CROSS JOIN LATERAL (
      SELECT pg_catalog.array_agg(m.queue_name::text ORDER BY m.queue_name::text) AS spellings
      FROM pgmq.meta AS m
      WHERE pg_catalog.lower(m.queue_name::text COLLATE "C") = pg_catalog.lower(q.queue_name COLLATE "C")
    ) AS meta
  )
  SELECT p.queue_name,
         p.origins,
         CASE WHEN pg_catalog.cardinality(p.spellings) = 1 THEN p.spellings[1] END,
         coalesce(pg_catalog.cardinality(p.spellings), 0),
         p.q_reg,
         p.a_reg,
         (SELECT pg_catalog.pg_get_userbyid(c.relowner) FROM pg_catalog.pg_class AS c WHERE c.oid = coalesce(p.q_reg, p.a_reg)),
         p.own_problems
         || CASE WHEN NOT pgflow.is_valid_queue_name(p.queue_name)
                 THEN ARRAY[pg_catalog.format('"%s" is not a valid generated queue name', p.queue_name)] ELSE '{}' END
         || CASE WHEN pg_catalog.cardinality(p.spellings) > 1
                 THEN ARRAY[pg_catalog.format('several pgmq.meta rows map to its tables (%s)', pg_catalog.array_to_string(p.spellings, ', '))]
                 ELSE '{}' END
         || ARRAY(SELECT DISTINCT pg_catalog.format('flow "%s" routes steps to it', s.flow_slug)
                  FROM pgflow.steps AS s
                  WHERE s.queue_name = p.queue_name AND s.flow_slug <> _drop_flow_route.flow_slug
                  ORDER BY 1)
         || ARRAY(SELECT pg_catalog.format('tasks of flow "%s" are in it', x.flow_slug)
                  FROM (SELECT DISTINCT t.flow_slug FROM pgflow.step_tasks AS t
                        WHERE t.queue_name = p.queue_name AND t.flow_slug <> _drop_flow_route.flow_slug) AS x
                  ORDER BY 1)
         || ARRAY(SELECT pg_catalog.format('it is the default queue of flow "%s"', f.flow_slug)
                  FROM pgflow.flows AS f
                  WHERE f.flow_slug <> _drop_flow_route.flow_slug AND f.queue_mode = 'flow'
                    AND pg_catalog.lower(f.flow_slug COLLATE "C") = p.queue_name
                  ORDER BY 1)
  FROM physical AS p
  ORDER BY 1
$$;

REVOKE ALL ON FUNCTION pgflow._drop_flow_route(text) FROM PUBLIC;

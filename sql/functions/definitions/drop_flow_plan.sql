-- pgflow.drop_flow_plan(flow_slug): what pgflow.drop_flow(flow_slug) would delete and whether it
-- would go ahead, without changing or locking anything (docs/drop-flow.md "The plan").
--
-- Returns jsonb:
--   flow_slug, queue_mode
--   rows      {"flows", "steps", "deps", "runs", "step_states", "step_tasks", "workers"}: rows deleted
--   by_status {"runs": {status: n}, "step_states": {...}, "step_tasks": {...}}
--   queues    [{"queue_name", "origins", "listed_as", "listings", "queue_table", "archive_table",
--              "table_owner", "messages", "archived", "bytes", "state": "present" | "missing",
--              "problems": [text]}]: messages and archived are exact counts; bytes is the total
--              size of both tables with their indexes
--   activity  pgflow._drop_flow_activity(flow_slug)
--   problems  every queue problem, as 'queue "x": reason' (deletion refuses while any exists)
--   verdict   'ready' (drop_flow will run), 'needs_force' (only with force => true: activity
--             blockers), 'refused' (queue problems; force does not help)
-- Raises PF006 for an unknown flow. Counts only: never run inputs, outputs or message bodies.
CREATE OR REPLACE FUNCTION pgflow.drop_flow_plan(flow_slug text)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = ''
AS $$
DECLARE
  v_mode text := pgflow._require_flow(drop_flow_plan.flow_slug);
  v_route record;
  v_queues jsonb := '[]'::jsonb;
  v_problems text[] := '{}';
  v_messages bigint;
  v_archived bigint;
  v_activity jsonb := pgflow._drop_flow_activity(drop_flow_plan.flow_slug);
  v_rows jsonb;
  v_by_status jsonb;
BEGIN
  FOR v_route IN SELECT * FROM pgflow._drop_flow_route(drop_flow_plan.flow_slug) LOOP
    v_messages := NULL;
    v_archived := NULL;
    IF v_route.q_table IS NOT NULL THEN
      EXECUTE pg_catalog.format('SELECT pg_catalog.count(*) FROM pgmq.%I', pgmq.format_table_name(v_route.queue_name, 'q')) INTO v_messages;
    END IF;
    IF v_route.a_table IS NOT NULL THEN
      EXECUTE pg_catalog.format('SELECT pg_catalog.count(*) FROM pgmq.%I', pgmq.format_table_name(v_route.queue_name, 'a')) INTO v_archived;
    END IF;
    v_queues := v_queues || pg_catalog.jsonb_build_object(
      'queue_name', v_route.queue_name,
      'origins', pg_catalog.to_jsonb(v_route.origins),
      'listed_as', v_route.listed_as,
      'listings', v_route.listings,
      'queue_table', v_route.q_table::text,
      'archive_table', v_route.a_table::text,
      'table_owner', v_route.table_owner,
      'messages', v_messages,
      'archived', v_archived,
      'bytes', coalesce(pg_catalog.pg_total_relation_size(v_route.q_table), 0)
               + coalesce(pg_catalog.pg_total_relation_size(v_route.a_table), 0),
      'state', CASE WHEN v_route.q_table IS NULL THEN 'missing' ELSE 'present' END,
      'problems', pg_catalog.to_jsonb(v_route.problems));
    v_problems := v_problems || ARRAY(SELECT pg_catalog.format('queue "%s": %s', v_route.queue_name, p)
                                      FROM pg_catalog.unnest(v_route.problems) AS p);
  END LOOP;

  SELECT pg_catalog.jsonb_build_object(
           'flows', 1,
           'steps', (SELECT pg_catalog.count(*) FROM pgflow.steps AS s WHERE s.flow_slug = drop_flow_plan.flow_slug),
           'deps', (SELECT pg_catalog.count(*) FROM pgflow.deps AS d WHERE d.flow_slug = drop_flow_plan.flow_slug),
           'runs', (SELECT pg_catalog.count(*) FROM pgflow.runs AS r WHERE r.flow_slug = drop_flow_plan.flow_slug),
           'step_states', (SELECT pg_catalog.count(*) FROM pgflow.step_states AS ss WHERE ss.flow_slug = drop_flow_plan.flow_slug),
           'step_tasks', (SELECT pg_catalog.count(*) FROM pgflow.step_tasks AS t WHERE t.flow_slug = drop_flow_plan.flow_slug),
           'workers', (SELECT pg_catalog.count(*) FROM pg_catalog.jsonb_array_elements(v_activity -> 'workers') AS w
                       WHERE w ->> 'state' IN ('stale', 'stopped'))),
         pg_catalog.jsonb_build_object(
           'runs', (SELECT coalesce(pg_catalog.jsonb_object_agg(x.status, x.n), '{}'::jsonb)
                    FROM (SELECT r.status, pg_catalog.count(*) AS n FROM pgflow.runs AS r
                          WHERE r.flow_slug = drop_flow_plan.flow_slug GROUP BY r.status) AS x),
           'step_states', (SELECT coalesce(pg_catalog.jsonb_object_agg(x.status, x.n), '{}'::jsonb)
                           FROM (SELECT ss.status, pg_catalog.count(*) AS n FROM pgflow.step_states AS ss
                                 WHERE ss.flow_slug = drop_flow_plan.flow_slug GROUP BY ss.status) AS x),
           'step_tasks', (SELECT coalesce(pg_catalog.jsonb_object_agg(x.status, x.n), '{}'::jsonb)
                          FROM (SELECT t.status, pg_catalog.count(*) AS n FROM pgflow.step_tasks AS t
                                WHERE t.flow_slug = drop_flow_plan.flow_slug GROUP BY t.status) AS x))
  INTO v_rows, v_by_status;

  RETURN pg_catalog.jsonb_build_object(
    'flow_slug', drop_flow_plan.flow_slug,
    'queue_mode', v_mode,
    'rows', v_rows,
    'by_status', v_by_status,
    'queues', v_queues,
    'activity', v_activity,
    'problems', pg_catalog.to_jsonb(v_problems),
    'verdict', CASE
                 WHEN pg_catalog.cardinality(v_problems) > 0 THEN 'refused'
                 WHEN NOT (v_activity ->> 'allowed')::boolean THEN 'needs_force'
                 ELSE 'ready'
               END);
END;
$$;

REVOKE ALL ON FUNCTION pgflow.drop_flow_plan(text) FROM PUBLIC;

-- Whole-flow deletion without questions, for local recompilation (ensure_flow_compiled when
-- is_local()): runtime rows, definition and the flow's own queues (with archives), in one
-- transaction. Operators use pgflow.drop_flow, which plans, refuses and reports (docs/drop-flow.md).
-- Both share the locks (pgflow._lock_flow_for_deletion: flow locks, then every run FOR UPDATE; tasks
-- and step states are locked as they are deleted) and the row deletion (pgflow._delete_flow_rows),
-- so deletion and workers take rows in the same order and cannot deadlock. Queue tables are dropped
-- whole; messages are not archived one by one first. A queue another flow also uses (never the case
-- for generated names) is kept, with only this flow's live messages archived.
-- Dropping a table is its owner's right, and pgmq.drop_queue quietly skips a table the caller cannot
-- see: so the caller's right to drop every queue it would drop is checked before anything changes
-- (42501 naming each queue and its owner), rather than deleting the rows and leaving the tables.
CREATE OR REPLACE FUNCTION pgflow.delete_flow_and_data(p_flow_slug text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_mode text;
  v_queues text[];
  v_shared text[];
  v_queue text;
  v_listed text;
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes integer[];
  v_denied text[];
BEGIN
  -- local recompilation (ensure_flow_compiled when is_local()) runs as the worker
  IF NOT pgflow.is_local() THEN
    PERFORM pgflow._require_caller('pgflow_operator', 'delete flows');
  END IF;
  PERFORM pgflow._lock_flow_for_deletion(p_flow_slug);

  SELECT f.queue_mode INTO v_mode FROM pgflow.flows AS f WHERE f.flow_slug = p_flow_slug;

  SELECT pg_catalog.array_agg(DISTINCT q.queue_name ORDER BY q.queue_name) INTO v_queues
  FROM (
    SELECT s.queue_name FROM pgflow.steps AS s WHERE s.flow_slug = p_flow_slug
    UNION
    SELECT pg_catalog.lower(p_flow_slug COLLATE "C") WHERE v_mode = 'flow'
    UNION
    SELECT t.queue_name FROM pgflow.step_tasks AS t WHERE t.flow_slug = p_flow_slug
  ) AS q;

  SELECT pg_catalog.array_agg(q ORDER BY q) INTO v_shared
  FROM pg_catalog.unnest(coalesce(v_queues, '{}')) AS q
  WHERE EXISTS (SELECT 1 FROM pgflow.steps AS s WHERE s.queue_name = q AND s.flow_slug <> p_flow_slug)
     OR EXISTS (SELECT 1 FROM pgflow.step_tasks AS t WHERE t.queue_name = q AND t.flow_slug <> p_flow_slug)
     OR EXISTS (SELECT 1 FROM pgflow.flows AS f
                WHERE f.flow_slug <> p_flow_slug AND f.queue_mode = 'flow'
                  AND pg_catalog.lower(f.flow_slug COLLATE "C") = q);

  SELECT pg_catalog.array_agg(pg_catalog.format('queue "%s" (tables owned by "%s")', q, o.owner) ORDER BY q)
  INTO v_denied
  FROM pg_catalog.unnest(coalesce(v_queues, '{}')) AS q
  CROSS JOIN LATERAL (
    SELECT pg_catalog.pg_get_userbyid(c.relowner) AS owner
    FROM pg_catalog.pg_class AS c
    WHERE c.oid IN (pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', pgmq.format_table_name(q, 'q'))),
                    pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', pgmq.format_table_name(q, 'a'))))
  ) AS o
  WHERE q <> ALL (coalesce(v_shared, '{}')) AND NOT pg_catalog.pg_has_role(current_user, o.owner, 'USAGE');
  IF v_denied IS NOT NULL THEN
    RAISE EXCEPTION 'role "%" may not drop the queue tables of flow "%": %; nothing was deleted',
      current_user, p_flow_slug, pg_catalog.array_to_string(v_denied, ', ')
      USING ERRCODE = '42501', HINT = 'dropping a table is its owner''s right: run as that role, or GRANT it TO the role that deletes';
  END IF;

  IF v_shared IS NOT NULL THEN
    SELECT pg_catalog.array_agg(t.run_id), pg_catalog.array_agg(t.step_slug), pg_catalog.array_agg(t.task_index)
    INTO v_run_ids, v_step_slugs, v_task_indexes
    FROM pgflow.step_tasks AS t
    WHERE t.flow_slug = p_flow_slug AND t.queue_name = ANY (v_shared)
      AND t.message_id IS NOT NULL AND t.status IN ('queued', 'started')
      AND pgflow._queue_exists(t.queue_name);
    PERFORM pgflow._archive_task_messages(v_run_ids, v_step_slugs, v_task_indexes);
  END IF;

  PERFORM pgflow._delete_flow_rows(p_flow_slug, ARRAY['step_tasks', 'step_states', 'runs']);

  FOREACH v_queue IN ARRAY coalesce(v_queues, '{}') LOOP
    CONTINUE WHEN v_queue = ANY (coalesce(v_shared, '{}'));
    v_listed := pgflow._listed_queue_name(v_queue);
    IF pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', pgmq.format_table_name(v_queue, 'q'))) IS NOT NULL THEN
      PERFORM pgmq.drop_queue(v_listed);
    ELSE
      -- tables already gone: pgmq.drop_queue() would keep the meta row; remove our leftovers
      EXECUTE pg_catalog.format('DROP TABLE IF EXISTS pgmq.%I', pgmq.format_table_name(v_queue, 'a'));
      DELETE FROM pgmq.meta AS m WHERE m.queue_name = v_listed;
    END IF;
  END LOOP;

  PERFORM pgflow._delete_flow_rows(p_flow_slug, ARRAY['deps', 'steps', 'flows']);
END;
$$;

-- pgflow.drop_flow(flow_slug, force): whole-flow deletion in one transaction (spec "Generated
-- private ownership": whole-flow deletion; docs/drop-flow.md).
--
-- In this order, which is the runtime's lock order (docs/runtime.md "Lock order"):
--   1. who: the owner of pgflow's tables, or a member of the role pgflow_operator (42501 for
--      anyone else, even with EXECUTE: the worker recipe grants EXECUTE on every function);
--   2. locks: the flow advisory locks, then every run FOR UPDATE (pgflow._lock_flow_for_deletion);
--   3. checks, all before anything changes: the flow exists with exactly this slug (PF006); its
--      complete private route is its own (pgflow._drop_flow_route; PF004 with every problem: a
--      queue another flow routes to or has tasks in, several pgmq.meta rows for one set of
--      tables, a step off its generated queue, tasks outside the route); the caller may drop each
--      queue table (42501 naming its owner); unless force, nothing still works on the flow
--      (pgflow._drop_flow_activity; PF008 with the blockers);
--   4. runtime rows: tasks, step states, runs; then the flow's stale and stopped worker rows are
--      deleted and its live ones are told to stop (deprecated_at; their next heartbeat returns
--      true). worker_functions rows are left to the operator;
--   5. queues: each route queue under PGMQ's own queue lock, with pgmq.drop_queue(<exact pgmq.meta
--      spelling>) and its answer checked. Messages are never archived first: the queue and archive
--      tables go as a whole. A queue whose table is already gone is reported 'already_gone'
--      (its leftover archive table or meta row is removed and named);
--   6. definition: dependencies, steps, flow;
--   7. verification: no row of the flow and no table or meta row of its queues is left.
--
-- Returns jsonb: {"flow_slug", "queue_mode", "forced", "deleted": {"step_tasks", "step_states",
-- "runs", "deps", "steps", "flows", "workers"}, "workers_told_to_stop", "queues": [{"queue_name",
-- "listed_as", "outcome": "dropped" | "already_gone", "messages", "archived", "leftovers": [text]}],
-- "activity": the activity seen under the locks}.
-- Errors (nothing deleted): PF006 unknown flow, PF004 route problems or PGMQ refusing a drop,
-- PF008 still active without force, 42501 not allowed.
CREATE OR REPLACE FUNCTION pgflow.drop_flow(flow_slug text, force boolean DEFAULT false)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_mode text;
  v_route record;
  v_routes jsonb;
  v_problems text[];
  v_denied text[];
  v_activity jsonb;
  v_rows jsonb;
  v_definition jsonb;
  v_queues jsonb := '[]'::jsonb;
  v_workers_deleted bigint;
  v_workers_told bigint;
  v_messages bigint;
  v_archived bigint;
  v_outcome text;
  v_leftovers text[];
  v_left text[];
BEGIN
  PERFORM pgflow._require_caller('pgflow_operator', 'drop flows');

  PERFORM pgflow._lock_flow_for_deletion(drop_flow.flow_slug);
  v_mode := pgflow._require_flow(drop_flow.flow_slug);

  -- The route once (it reads the flow's tasks): checked now, dropped below.
  SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.to_jsonb(r) ORDER BY r.queue_name), '[]'::jsonb) INTO v_routes
  FROM pgflow._drop_flow_route(drop_flow.flow_slug) AS r;

  SELECT pg_catalog.array_agg(pg_catalog.format('queue "%s": %s', r.queue_name, p) ORDER BY r.queue_name, p)
  INTO v_problems
  FROM pg_catalog.jsonb_to_recordset(v_routes) AS r (queue_name text, problems text[]), pg_catalog.unnest(r.problems) AS p;
  IF v_problems IS NOT NULL THEN
    RAISE EXCEPTION 'flow "%" cannot be dropped: % problem(s) with the queues it would drop; nothing was deleted',
      drop_flow.flow_slug, pg_catalog.cardinality(v_problems)
      USING ERRCODE = 'PF004', DETAIL = pg_catalog.array_to_string(v_problems, E'\n'),
            HINT = 'pgflow drops only queues a flow owns alone; fix each problem first (docs/drop-flow.md "Refusals")';
  END IF;

  SELECT pg_catalog.array_agg(pg_catalog.format('queue "%s" (tables owned by "%s")', r.queue_name, r.table_owner) ORDER BY r.queue_name)
  INTO v_denied
  FROM pg_catalog.jsonb_to_recordset(v_routes) AS r (queue_name text, table_owner name)
  WHERE r.table_owner IS NOT NULL AND NOT pg_catalog.pg_has_role(current_user, r.table_owner, 'USAGE');
  IF v_denied IS NOT NULL THEN
    RAISE EXCEPTION 'role "%" may not drop the queue tables of flow "%": %; nothing was deleted',
      current_user, drop_flow.flow_slug, pg_catalog.array_to_string(v_denied, ', ')
      USING ERRCODE = '42501', HINT = 'dropping a table is its owner''s right: run as that role, or GRANT it TO the role that drops';
  END IF;

  v_activity := pgflow._drop_flow_activity(drop_flow.flow_slug);
  IF NOT drop_flow.force AND NOT (v_activity ->> 'allowed')::boolean THEN
    RAISE EXCEPTION 'flow "%" is still active; nothing was deleted', drop_flow.flow_slug
      USING ERRCODE = 'PF008',
            DETAIL = (SELECT pg_catalog.string_agg(b, E'\n') FROM pg_catalog.jsonb_array_elements_text(v_activity -> 'blockers') AS b),
            HINT = 'fence the flow''s worker functions and wait until no task is in flight (docs/drop-flow.md), or pass force => true to abandon its started runs';
  END IF;

  v_rows := pgflow._delete_flow_rows(drop_flow.flow_slug, ARRAY['step_tasks', 'step_states', 'runs']);

  WITH gone AS (
    DELETE FROM pgflow.workers AS w
    WHERE w.flow_slug = drop_flow.flow_slug
      AND w.worker_id IN (SELECT (x ->> 'worker_id')::uuid FROM pg_catalog.jsonb_array_elements(v_activity -> 'workers') AS x
                          WHERE x ->> 'state' IN ('stale', 'stopped'))
    RETURNING 1
  )
  SELECT pg_catalog.count(*) INTO v_workers_deleted FROM gone;
  WITH told AS (
    UPDATE pgflow.workers AS w SET deprecated_at = pg_catalog.now()
    WHERE w.flow_slug = drop_flow.flow_slug AND w.deprecated_at IS NULL AND w.stopped_at IS NULL
    RETURNING 1
  )
  SELECT pg_catalog.count(*) INTO v_workers_told FROM told;

  FOR v_route IN
    SELECT * FROM pg_catalog.jsonb_to_recordset(v_routes) AS r (queue_name text, listed_as text, q_table regclass, a_table regclass)
  LOOP
    -- PGMQ's creation lock for the canonical name (pgflow.create_flow takes it): nobody creates
    -- these tables under another letter case while they go. drop_queue takes the listed one.
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('pgmq.queue_' || v_route.queue_name));
    v_messages := NULL;
    v_archived := NULL;
    v_leftovers := '{}';
    IF v_route.q_table IS NOT NULL THEN
      EXECUTE pg_catalog.format('SELECT pg_catalog.count(*) FROM pgmq.%I', pgmq.format_table_name(v_route.queue_name, 'q')) INTO v_messages;
      IF v_route.a_table IS NOT NULL THEN
        EXECUTE pg_catalog.format('SELECT pg_catalog.count(*) FROM pgmq.%I', pgmq.format_table_name(v_route.queue_name, 'a')) INTO v_archived;
      END IF;
      IF v_route.listed_as IS NULL THEN
        v_leftovers := v_leftovers || 'no pgmq.meta row listed the queue'::text;
      END IF;
      IF NOT pgmq.drop_queue(coalesce(v_route.listed_as, v_route.queue_name)) THEN
        RAISE EXCEPTION 'PGMQ did not drop queue "%" of flow "%" (pgmq.drop_queue(%) returned false); nothing was deleted',
          v_route.queue_name, drop_flow.flow_slug, pg_catalog.quote_literal(coalesce(v_route.listed_as, v_route.queue_name))
          USING ERRCODE = 'PF004', HINT = 'check that the queue table is visible to this role (PGMQ looks it up in information_schema.tables)';
      END IF;
      v_outcome := 'dropped';
    ELSE
      v_outcome := 'already_gone';
      IF v_route.a_table IS NOT NULL THEN
        EXECUTE pg_catalog.format('SELECT pg_catalog.count(*) FROM pgmq.%I', pgmq.format_table_name(v_route.queue_name, 'a')) INTO v_archived;
        v_leftovers := v_leftovers || pg_catalog.format('dropped the leftover archive table %s', v_route.a_table);
        EXECUTE pg_catalog.format('DROP TABLE pgmq.%I', pgmq.format_table_name(v_route.queue_name, 'a'));
      END IF;
      IF v_route.listed_as IS NOT NULL THEN
        DELETE FROM pgmq.meta AS m WHERE m.queue_name = v_route.listed_as;
        v_leftovers := v_leftovers || pg_catalog.format('deleted the leftover pgmq.meta row %s', pg_catalog.quote_literal(v_route.listed_as));
      END IF;
    END IF;
    v_queues := v_queues || pg_catalog.jsonb_build_object(
      'queue_name', v_route.queue_name, 'listed_as', v_route.listed_as, 'outcome', v_outcome,
      'messages', v_messages, 'archived', v_archived, 'leftovers', pg_catalog.to_jsonb(v_leftovers));
  END LOOP;

  v_definition := pgflow._delete_flow_rows(drop_flow.flow_slug, ARRAY['deps', 'steps', 'flows']);

  -- Nothing of the flow is left (a bug or a concurrent writer ignoring the locks would show here).
  SELECT pg_catalog.array_remove(ARRAY[
           CASE WHEN EXISTS (SELECT 1 FROM pgflow.flows AS f WHERE f.flow_slug = drop_flow.flow_slug) THEN 'flows' END,
           CASE WHEN EXISTS (SELECT 1 FROM pgflow.steps AS s WHERE s.flow_slug = drop_flow.flow_slug) THEN 'steps' END,
           CASE WHEN EXISTS (SELECT 1 FROM pgflow.runs AS r WHERE r.flow_slug = drop_flow.flow_slug) THEN 'runs' END,
           CASE WHEN EXISTS (SELECT 1 FROM pgflow.step_tasks AS t WHERE t.flow_slug = drop_flow.flow_slug) THEN 'step_tasks' END
         ], NULL)
         || ARRAY(SELECT pg_catalog.format('queue %s', q ->> 'queue_name')
                  FROM pg_catalog.jsonb_array_elements(v_queues) AS q
                  WHERE pgflow._queue_exists(q ->> 'queue_name')
                     OR pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', pgmq.format_table_name(q ->> 'queue_name', 'a'))) IS NOT NULL)
  INTO v_left;
  IF pg_catalog.cardinality(v_left) > 0 THEN
    RAISE EXCEPTION 'drop_flow(): flow "%" still has % after deletion; rolled back', drop_flow.flow_slug,
      pg_catalog.array_to_string(v_left, ', ')
      USING ERRCODE = 'XX000';
  END IF;

  RETURN pg_catalog.jsonb_build_object(
    'flow_slug', drop_flow.flow_slug,
    'queue_mode', v_mode,
    'forced', drop_flow.force,
    'deleted', v_rows || v_definition || pg_catalog.jsonb_build_object('workers', v_workers_deleted),
    'workers_told_to_stop', v_workers_told,
    'queues', v_queues,
    'activity', v_activity);
END;
$$;

REVOKE ALL ON FUNCTION pgflow.drop_flow(text, boolean) FROM PUBLIC;

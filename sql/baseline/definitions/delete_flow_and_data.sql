--@note Protocol-1 baseline: pgflow.delete_flow_and_data as migration 0002 installed it, before 0003
--@note replaced it. Frozen: only the released baseline migrations include it. The current
--@note version, and the lines this file reuses, are in functions/definitions/delete_flow_and_data.sql.
-- Deletes a flow with all its runtime data and drops its queue, in one transaction.
-- Lock order: flow advisory lock -> runs -> step_states -> step_tasks (locked, then deleted)
-- -> queue tables (drop_queue) -> deps, steps, flows. Workers that hold task rows finish
-- first; a worker that later touches the dropped queue gets an error, never half a flow.
-- The queue is dropped only when pgmq.meta lists exactly this name and no other spelling of
-- it (a case alias shares the same physical table); otherwise the flow's live messages are
-- archived and the queue is left alone. workers and worker_functions are not touched.
--@include functions/definitions/delete_flow_and_data.sql lines=9-15
  v_drop boolean;
--@include functions/definitions/delete_flow_and_data.sql lines=21-24
  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(p_flow_slug));

  PERFORM 1 FROM pgflow.runs AS r WHERE r.flow_slug = p_flow_slug ORDER BY r.run_id FOR UPDATE;
  PERFORM 1 FROM pgflow.step_states AS ss WHERE ss.flow_slug = p_flow_slug
    ORDER BY ss.run_id, ss.step_slug FOR UPDATE;
  PERFORM 1 FROM pgflow.step_tasks AS t WHERE t.flow_slug = p_flow_slug
    ORDER BY t.run_id, t.step_slug, t.task_index FOR UPDATE;

  v_drop := EXISTS (SELECT 1 FROM pgmq.meta AS m WHERE m.queue_name = p_flow_slug)
            AND NOT EXISTS (SELECT 1 FROM pgmq.meta AS m
                            WHERE pg_catalog.lower(m.queue_name) = pg_catalog.lower(p_flow_slug)
                              AND m.queue_name <> p_flow_slug)
            AND NOT EXISTS (SELECT 1 FROM pgflow.flows AS f
                            WHERE pg_catalog.lower(f.flow_slug) = pg_catalog.lower(p_flow_slug)
                              AND f.flow_slug <> p_flow_slug);

  IF NOT v_drop AND pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', pgmq.format_table_name(p_flow_slug, 'q'))) IS NOT NULL THEN
--@include functions/definitions/delete_flow_and_data.sql lines=47-49
    WHERE t.flow_slug = p_flow_slug AND t.message_id IS NOT NULL AND t.status IN ('queued', 'started');
--@include functions/definitions/delete_flow_and_data.sql lines=53-55
  DELETE FROM pgflow.step_tasks AS t WHERE t.flow_slug = p_flow_slug;
  DELETE FROM pgflow.step_states AS ss WHERE ss.flow_slug = p_flow_slug;
  DELETE FROM pgflow.runs AS r WHERE r.flow_slug = p_flow_slug;

  IF v_drop THEN
    PERFORM pgmq.drop_queue(p_flow_slug);
  END IF;

  DELETE FROM pgflow.deps AS d WHERE d.flow_slug = p_flow_slug;
  DELETE FROM pgflow.steps AS s WHERE s.flow_slug = p_flow_slug;
  DELETE FROM pgflow.flows AS f WHERE f.flow_slug = p_flow_slug;
END;
$$;

CREATE OR REPLACE FUNCTION pgflow._archive_task_messages(
  p_run_ids uuid[],
  p_step_slugs text[],
  p_task_indexes integer[]
)
--@include functions/queues/parts/task_messages_header.sql
  --@include functions/queues/parts/task_messages_checks.sql
     OR pg_catalog.cardinality(p_run_ids) IS DISTINCT FROM pg_catalog.cardinality(p_task_indexes) THEN
    RAISE EXCEPTION '_archive_task_messages(): the task key arrays differ in length (% run ids, % step slugs, % task indexes)',
      pg_catalog.cardinality(p_run_ids), pg_catalog.cardinality(p_step_slugs), pg_catalog.cardinality(p_task_indexes)
      USING ERRCODE = '22023';
  END IF;

  FOR v_queue, v_msg_ids IN
    SELECT t.queue_name,
           pg_catalog.array_agg(DISTINCT t.message_id ORDER BY t.message_id)
    FROM ROWS FROM (pg_catalog.unnest(p_run_ids), pg_catalog.unnest(p_step_slugs), pg_catalog.unnest(p_task_indexes)) AS k (run_id, step_slug, task_index)
    --@include functions/queues/parts/task_messages_lookup.sql
  LOOP
    SELECT pg_catalog.count(*)::integer INTO v_count FROM pgmq.archive(v_queue, v_msg_ids);
    v_total := v_total + v_count;
  END LOOP;
  RETURN v_total;
END;
$$;

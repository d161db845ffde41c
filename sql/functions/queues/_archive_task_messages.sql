CREATE OR REPLACE FUNCTION pgflow._archive_task_messages(
  p_run_ids uuid[],
  p_step_slugs text[],
  p_task_indexes integer[]
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_queue text;
  v_msg_ids bigint[];
  v_count integer;
  v_total integer := 0;
BEGIN
  IF coalesce(pg_catalog.cardinality(p_run_ids), 0) = 0 THEN
    RETURN 0;
  END IF;
  IF pg_catalog.cardinality(p_run_ids) IS DISTINCT FROM pg_catalog.cardinality(p_step_slugs)
     OR pg_catalog.cardinality(p_run_ids) IS DISTINCT FROM pg_catalog.cardinality(p_task_indexes) THEN
    RAISE EXCEPTION '_archive_task_messages(): the task key arrays differ in length (% run ids, % step slugs, % task indexes)',
      pg_catalog.cardinality(p_run_ids), pg_catalog.cardinality(p_step_slugs), pg_catalog.cardinality(p_task_indexes)
      USING ERRCODE = '22023';
  END IF;

  FOR v_queue, v_msg_ids IN
    SELECT t.queue_name,
           pg_catalog.array_agg(DISTINCT t.message_id ORDER BY t.message_id)
    FROM ROWS FROM (pg_catalog.unnest(p_run_ids), pg_catalog.unnest(p_step_slugs), pg_catalog.unnest(p_task_indexes)) AS k (run_id, step_slug, task_index)
    -- one primary-key probe per task, whatever the table size
    JOIN LATERAL (
      SELECT st.queue_name, st.message_id FROM pgflow.step_tasks AS st
      WHERE st.run_id = k.run_id AND st.step_slug = k.step_slug AND st.task_index = k.task_index
      LIMIT 1  -- the primary key; keeps the planner from flattening this into a hash join
    ) AS t ON true
    WHERE t.message_id IS NOT NULL
    GROUP BY t.queue_name
    ORDER BY t.queue_name
  LOOP
    SELECT pg_catalog.count(*)::integer INTO v_count FROM pgmq.archive(v_queue, v_msg_ids);
    v_total := v_total + v_count;
  END LOOP;
  RETURN v_total;
END;
$$;

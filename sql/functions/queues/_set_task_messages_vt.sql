CREATE OR REPLACE FUNCTION pgflow._set_task_messages_vt(
  p_run_ids uuid[],
  p_step_slugs text[],
  p_task_indexes integer[],
  p_vt_offsets integer[]
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_queue text;
  v_msg_ids bigint[];
  v_offsets integer[];
  v_count integer;
  v_total integer := 0;
BEGIN
  IF coalesce(pg_catalog.cardinality(p_run_ids), 0) = 0 THEN
    RETURN 0;
  END IF;
  IF pg_catalog.cardinality(p_run_ids) IS DISTINCT FROM pg_catalog.cardinality(p_step_slugs)
     OR pg_catalog.cardinality(p_run_ids) IS DISTINCT FROM pg_catalog.cardinality(p_task_indexes)
     OR pg_catalog.cardinality(p_run_ids) IS DISTINCT FROM pg_catalog.cardinality(p_vt_offsets) THEN
    RAISE EXCEPTION '_set_task_messages_vt(): the argument arrays differ in length'
      USING ERRCODE = '22023';
  END IF;
  IF pg_catalog.array_position(p_vt_offsets, NULL) IS NOT NULL THEN
    RAISE EXCEPTION '_set_task_messages_vt(): a visibility offset is NULL'
      USING ERRCODE = '22023';
  END IF;

  FOR v_queue, v_msg_ids, v_offsets IN
    SELECT t.queue_name,
           pg_catalog.array_agg(t.message_id ORDER BY t.message_id),
           pg_catalog.array_agg(k.vt_offset ORDER BY t.message_id)
    FROM (
      SELECT DISTINCT ON (u.run_id, u.step_slug, u.task_index) u.run_id, u.step_slug, u.task_index, u.vt_offset
      FROM ROWS FROM (pg_catalog.unnest(p_run_ids), pg_catalog.unnest(p_step_slugs), pg_catalog.unnest(p_task_indexes), pg_catalog.unnest(p_vt_offsets))
           AS u (run_id, step_slug, task_index, vt_offset)
      ORDER BY u.run_id, u.step_slug, u.task_index
    ) AS k
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
    -- by primary key (= ANY), never a join that could hash a scan of the queue table; each
    -- message takes the offset at its own position
    EXECUTE pg_catalog.format(
      'UPDATE pgmq.%I AS q
          SET vt = pg_catalog.clock_timestamp()
                   + pg_catalog.make_interval(secs => $2[pg_catalog.array_position($1, q.msg_id)])
        WHERE q.msg_id = ANY ($1)',
      pgmq.format_table_name(v_queue, 'q'))
    USING v_msg_ids, v_offsets;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    v_total := v_total + v_count;
  END LOOP;
  RETURN v_total;
END;
$$;

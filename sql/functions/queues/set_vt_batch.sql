-- Upstream-compatible batch visibility change on one queue (not used by the runtime itself,
-- which goes through _set_task_messages_vt). Returns the rows it changed.
CREATE OR REPLACE FUNCTION pgflow.set_vt_batch(queue_name text, msg_ids bigint[], vt_offsets integer[])
RETURNS TABLE (msg_id bigint, read_ct integer, enqueued_at timestamptz, vt timestamptz, message jsonb, headers jsonb)
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
BEGIN
  IF coalesce(pg_catalog.cardinality(set_vt_batch.msg_ids), 0) = 0
     OR coalesce(pg_catalog.cardinality(set_vt_batch.vt_offsets), 0) = 0 THEN
    RETURN;
  END IF;
  IF pg_catalog.cardinality(set_vt_batch.msg_ids) <> pg_catalog.cardinality(set_vt_batch.vt_offsets) THEN
    RAISE EXCEPTION 'set_vt_batch(): msg_ids has % elements but vt_offsets has %',
      pg_catalog.cardinality(set_vt_batch.msg_ids), pg_catalog.cardinality(set_vt_batch.vt_offsets)
      USING ERRCODE = '22023';
  END IF;
  RETURN QUERY EXECUTE pg_catalog.format(
    'UPDATE pgmq.%I AS q
        SET vt = pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => v.vt_offset)
       FROM ROWS FROM (pg_catalog.unnest($1::bigint[]), pg_catalog.unnest($2::integer[])) AS v (msg_id, vt_offset)
      WHERE q.msg_id = v.msg_id
      RETURNING q.msg_id, q.read_ct, q.enqueued_at, q.vt, q.message, q.headers',
    pgmq.format_table_name(set_vt_batch.queue_name, 'q'))
  USING set_vt_batch.msg_ids, set_vt_batch.vt_offsets;
END;
$$;

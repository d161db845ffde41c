-- One batch of `pgflow prune` for one queue's PGMQ archive (docs/commands/prune.md): deletes up to
-- p_batch_size rows of pgmq.a_<queue> archived before p_cutoff, oldest first, in the caller's
-- transaction.
--
--   p_queue_name  a queue some step routes to (pgflow.steps.queue_name); any other name is refused,
--                 so this never reaches a queue pgflow does not use;
--   p_cutoff      rows with archived_at before this moment go;
--   p_batch_size  rows per batch, 1 to 100000;
--   p_dry_run     count every row older than the cutoff (not only one batch); delete nothing.
--
-- Archive rows are written once (pgmq.archive inserts them) and never locked by a worker, so this
-- waits for nobody and nobody waits for it; it reads the archive's archived_at index.
-- Returns the number of rows deleted (dry run: that would be); 0 when the queue has no archive table.
-- Errors: 22023 a NULL cutoff, a batch size outside 1..100000, or a queue no step routes to.
-- Operator only: anyone but the owner of the pgflow tables or a member of pgflow_operator gets 42501
-- (pgflow._require_caller; a worker holds EXECUTE on every function, so the grant cannot tell them apart).
CREATE OR REPLACE FUNCTION pgflow.prune_archive(p_queue_name text, p_cutoff timestamptz, p_batch_size integer,
                                                p_dry_run boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_table text;
  v_count bigint;
BEGIN
  PERFORM pgflow._require_caller('pgflow_operator', 'prune queue archives');
  IF p_cutoff IS NULL OR p_batch_size IS NULL OR p_batch_size NOT BETWEEN 1 AND 100000 THEN
    RAISE EXCEPTION 'prune_archive(): the cutoff must be a time and the batch size 1 to 100000, got % and %',
      coalesce(p_cutoff::text, 'NULL'), coalesce(p_batch_size::text, 'NULL')
      USING ERRCODE = '22023';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pgflow.steps AS s WHERE s.queue_name = p_queue_name) THEN
    RAISE EXCEPTION 'prune_archive(): no step routes to queue %', coalesce(pg_catalog.quote_literal(p_queue_name), 'NULL')
      USING ERRCODE = '22023', HINT = 'pgflow prunes only the archives of the queues its steps route to';
  END IF;
  v_table := pgmq.format_table_name(p_queue_name, 'a');
  IF pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', v_table)) IS NULL THEN
    RETURN 0;
  END IF;
  IF p_dry_run THEN
    EXECUTE pg_catalog.format('SELECT pg_catalog.count(*) FROM pgmq.%I AS a WHERE a.archived_at < $1', v_table)
      INTO v_count USING p_cutoff;
  ELSE
    EXECUTE pg_catalog.format(
      'DELETE FROM pgmq.%1$I AS a WHERE a.msg_id IN ('
      'SELECT o.msg_id FROM pgmq.%1$I AS o WHERE o.archived_at < $1 ORDER BY o.archived_at LIMIT $2)', v_table)
      USING p_cutoff, p_batch_size;
    GET DIAGNOSTICS v_count = ROW_COUNT;
  END IF;
  RETURN v_count;
END;
$$;

REVOKE ALL ON FUNCTION pgflow.prune_archive(text, timestamptz, integer, boolean) FROM PUBLIC;

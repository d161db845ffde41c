-- True when PGMQ has the queue (a meta row in any letter case, or its queue table).
CREATE OR REPLACE FUNCTION pgflow._queue_exists(p_queue_name text)
RETURNS boolean
LANGUAGE sql
STABLE
SET search_path = ''
AS $$
  SELECT EXISTS (SELECT 1 FROM pgmq.meta AS m
                 WHERE pg_catalog.lower(m.queue_name::text COLLATE "C") = pg_catalog.lower(p_queue_name COLLATE "C"))
      OR pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', pgmq.format_table_name(p_queue_name, 'q'))) IS NOT NULL
$$;

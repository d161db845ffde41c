-- True when PGMQ has the queue (a meta row for its tables in any spelling, or its queue table).
CREATE OR REPLACE FUNCTION pgflow._queue_exists(p_queue_name text)
RETURNS boolean
LANGUAGE sql
STABLE
SET search_path = ''
AS $$
  -- a meta row naming this queue's tables, derived as PGMQ derives them (database collation)
  SELECT EXISTS (SELECT 1 FROM pgmq.meta AS m
                 WHERE ('q_' || pg_catalog.lower(m.queue_name::text COLLATE "default"))::name
                       = ('q_' || pg_catalog.lower(p_queue_name COLLATE "default"))::name)
      OR pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', pgmq.format_table_name(p_queue_name, 'q'))) IS NOT NULL
$$;

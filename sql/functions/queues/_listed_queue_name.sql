-- The spelling pgmq.meta lists for a queue (the row naming the same tables), for operations that need it
-- exactly (pgmq.drop_queue). Returns the argument when nothing is listed; PF004 when several
-- spellings map to the same tables.
CREATE OR REPLACE FUNCTION pgflow._listed_queue_name(p_queue_name text)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = ''
AS $$
DECLARE
  v_spellings text[];
BEGIN
  SELECT pg_catalog.array_agg(m.queue_name::text ORDER BY m.queue_name::text)
  INTO v_spellings
  FROM pgmq.meta AS m
  -- the rows whose tables are this queue's, derived as PGMQ derives them (lower() in the database
  -- collation): in a tr-TR database "Import" names q_ımport, not the tables of "import"
  WHERE ('q_' || pg_catalog.lower(m.queue_name::text COLLATE "default"))::name
        = ('q_' || pg_catalog.lower(p_queue_name COLLATE "default"))::name;
  IF v_spellings IS NULL THEN
    RETURN p_queue_name;
  END IF;
  IF pg_catalog.cardinality(v_spellings) > 1 THEN
    RAISE EXCEPTION 'queue "%" is listed in pgmq.meta under several spellings (%): they share one set of tables',
      p_queue_name, pg_catalog.array_to_string(v_spellings, ', ')
      USING ERRCODE = 'PF004', HINT = 'remove the surplus pgmq.meta rows by hand (see docs/audit.md, queue_alias_conflict)';
  END IF;
  RETURN v_spellings[1];
END;
$$;

-- The spelling pgmq.meta lists for a queue (case-insensitive match), for operations that need it
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
  WHERE pg_catalog.lower(m.queue_name::text COLLATE "C") = pg_catalog.lower(p_queue_name COLLATE "C");
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

-- A queue name as persisted by pgflow: lowercase ASCII letters, digits and _, 1..47 characters
-- (PGMQ's limit). Generated names always satisfy it.
CREATE OR REPLACE FUNCTION pgflow.is_valid_queue_name(queue_name text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = ''
AS $$
  SELECT queue_name IS NOT NULL
     AND pg_catalog.length(queue_name) BETWEEN 1 AND 47
     AND (queue_name COLLATE "C") ~ '^[a-z0-9_]+$'
$$;

-- Creates one generated private queue of a flow being provisioned (spec "Generated private
-- ownership"). The caller has already refused existing queues under PGMQ's creation lock for this
-- name; this refuses a queue that appears anyway, under another letter case (PGMQ's lock key is
-- case-sensitive, its tables are not): either our CREATE TABLE collides with the other session's
-- (unique_violation) or, when that session committed first, pgmq.meta then lists two spellings.
-- Both raise PF004 and roll the whole provisioning back: pgflow never adopts a queue.
CREATE OR REPLACE FUNCTION pgflow._create_private_queue(p_flow_slug text, p_queue_name text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
BEGIN
  BEGIN
    PERFORM pgmq.create(p_queue_name);
  EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'a PGMQ queue named "%" appeared while flow "%" was being provisioned; pgflow never adopts an existing queue',
      p_queue_name, p_flow_slug
      USING ERRCODE = 'PF004', HINT = 'find out who created that queue; drop it if unused, or choose another flow slug';
  END;
  BEGIN
    PERFORM pgflow._listed_queue_name(p_queue_name);
  EXCEPTION WHEN SQLSTATE 'PF004' THEN
    RAISE EXCEPTION 'a PGMQ queue named "%" (another letter case) appeared while flow "%" was being provisioned; pgflow never adopts an existing queue',
      p_queue_name, p_flow_slug
      USING ERRCODE = 'PF004', HINT = 'find out who created that queue; drop it if unused, or choose another flow slug';
  END;
END;
$$;

REVOKE ALL ON FUNCTION pgflow._create_private_queue(text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgflow.poll_for_tasks(
  queue_name text,
  vt integer,
  qty integer,
  max_poll_seconds integer DEFAULT 5,
  poll_interval_ms integer DEFAULT 100
)
RETURNS SETOF pgflow.step_task_record
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
BEGIN
  RAISE NOTICE 'pgflow.poll_for_tasks() is deprecated and returns nothing: read with pgmq.read_with_poll() and claim with pgflow.claim_tasks() (protocol 2)';
  RETURN;
END;
$$;

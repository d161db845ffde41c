-- Reserves the generated private queues of a step-queued flow about to be provisioned, before any
-- change: for each route queue (in name order) it takes PGMQ's own creation lock for that name, so a
-- concurrent pgmq.create() of it finishes before we look and is seen, then refuses the name when
-- anything holds it (_assert_queue_unclaimed: another flow's route or tasks, or an existing PGMQ
-- queue in any letter case; PF004). The locks last until the caller's transaction ends, so the
-- queues created afterwards (_create_private_queue) cannot be raced under the same spelling.
-- p_routes: [{"stepSlug", "queueName"}]. Caller holds the flow locks.
CREATE OR REPLACE FUNCTION pgflow._reserve_private_queues(p_flow_slug text, p_routes jsonb)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_queue text;
BEGIN
  FOR v_queue IN SELECT DISTINCT r ->> 'queueName' FROM pg_catalog.jsonb_array_elements(p_routes) AS r ORDER BY 1 LOOP
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('pgmq.queue_' || v_queue));
    PERFORM pgflow._assert_queue_unclaimed(p_flow_slug, v_queue);
  END LOOP;
END;
$$;

REVOKE ALL ON FUNCTION pgflow._reserve_private_queues(text, jsonb) FROM PUBLIC;

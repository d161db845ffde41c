-- Refuses (PF004) a queue a new definition would create when anything already holds that name:
-- another flow's route, another flow's tasks, or a PGMQ queue pgflow did not create for this
-- definition. pgflow never adopts an existing queue. Caller holds the flow locks.
CREATE OR REPLACE FUNCTION pgflow._assert_queue_unclaimed(p_flow_slug text, p_queue_name text)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = ''
AS $$
DECLARE
  v_other text;
BEGIN
  SELECT s.flow_slug INTO v_other FROM pgflow.steps AS s
  WHERE s.queue_name = p_queue_name AND s.flow_slug <> p_flow_slug LIMIT 1;
  IF v_other IS NULL THEN
    SELECT t.flow_slug INTO v_other FROM pgflow.step_tasks AS t
    WHERE t.queue_name = p_queue_name AND t.flow_slug <> p_flow_slug LIMIT 1;
  END IF;
  IF v_other IS NOT NULL THEN
    RAISE EXCEPTION 'queue "%" already belongs to flow "%"; flow "%" cannot use it', p_queue_name, v_other, p_flow_slug
      USING ERRCODE = 'PF004', HINT = 'choose another concrete flow slug';
  END IF;
  IF pgflow._queue_exists(p_queue_name) THEN
    RAISE EXCEPTION 'a PGMQ queue named "%" already exists and pgflow did not create it for flow "%"; pgflow never adopts an existing queue',
      p_queue_name, p_flow_slug
      USING ERRCODE = 'PF004',
            HINT = 'if that queue is unused, drop it (SELECT pgmq.drop_queue(<exact pgmq.meta spelling>)); otherwise choose another flow slug';
  END IF;
END;
$$;

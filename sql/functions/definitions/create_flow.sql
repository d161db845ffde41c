-- Creates a plain flow and its default queue lower(flow_slug); idempotent for an existing flow
-- (options unchanged). Refuses case aliases of existing flows (PF003) and queues pgflow did not
-- create for this flow (PF004).
CREATE OR REPLACE FUNCTION pgflow.create_flow(
  flow_slug text,
  max_attempts integer DEFAULT NULL,
  base_delay integer DEFAULT NULL,
  timeout integer DEFAULT NULL
)
RETURNS pgflow.flows
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_flow pgflow.flows;
  v_queue text := pgflow.default_queue_name(create_flow.flow_slug);
  v_alias text;
BEGIN
  IF create_flow.max_attempts < 0 OR create_flow.base_delay < 0 OR create_flow.timeout <= 0 THEN
    RAISE EXCEPTION 'invalid options for flow "%": max_attempts and base_delay must be >= 0, timeout > 0',
      create_flow.flow_slug
      USING ERRCODE = 'PF003';
  END IF;

  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(v_queue));
  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(create_flow.flow_slug));

  SELECT f.* INTO v_flow FROM pgflow.flows AS f WHERE f.flow_slug = create_flow.flow_slug;
  IF FOUND THEN
    IF v_flow.queue_mode = 'flow' AND NOT pgflow._queue_exists(v_queue) THEN
      RAISE EXCEPTION 'queue "%" of flow "%" is missing from PGMQ', v_queue, create_flow.flow_slug
        USING ERRCODE = 'PF004',
              HINT = pg_catalog.format('recreate it with SELECT pgmq.create(%L) if the flow should keep running', v_queue);
    END IF;
    RETURN v_flow;
  END IF;

  SELECT f.flow_slug INTO v_alias FROM pgflow.flows AS f
  WHERE pg_catalog.lower(f.flow_slug COLLATE "C") = v_queue;
  IF FOUND THEN
    RAISE EXCEPTION 'flow slug "%" differs only by letter case from existing flow "%"', create_flow.flow_slug, v_alias
      USING ERRCODE = 'PF003', HINT = 'flow slugs are unique ignoring case, because queue names are lowercase';
  END IF;
  -- PGMQ's own creation lock for this name: a concurrent pgmq.create() of it finishes (commits or
  -- rolls back) before we look, so a queue provisioned meanwhile is seen and refused, never adopted.
  PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('pgmq.queue_' || v_queue));
  PERFORM pgflow._assert_queue_unclaimed(create_flow.flow_slug, v_queue);
  PERFORM pgmq.validate_queue_name(v_queue);

  INSERT INTO pgflow.flows (flow_slug, opt_max_attempts, opt_base_delay, opt_timeout, queue_mode)
  VALUES (create_flow.flow_slug,
          coalesce(create_flow.max_attempts, 3),
          coalesce(create_flow.base_delay, 5),
          coalesce(create_flow.timeout, 60),
          'flow')
  RETURNING * INTO v_flow;
  BEGIN
    PERFORM pgmq.create(v_queue);
  EXCEPTION WHEN unique_violation THEN
    -- the same tables created concurrently under another letter case (another lock key)
    RAISE EXCEPTION 'a PGMQ queue named "%" appeared while flow "%" was being created; pgflow never adopts an existing queue',
      v_queue, create_flow.flow_slug
      USING ERRCODE = 'PF004', HINT = 'find out who created that queue; drop it if unused, or choose another flow slug';
  END;
  RETURN v_flow;
END;
$$;

-- Creates a flow and its steps from a worker's shape, in step order.
--   p_routes NULL (plain flow): create_flow (with its default queue lower(flow_slug)) + add_step.
--   p_routes = the ordered route map [{"stepSlug", "queueName"}] of a step-queued flow, derived and
--   validated by ensure_flow_compiled: before any change, under the caller's flow locks, case
--   aliases of the flow slug are refused (PF003) and every route queue is reserved under PGMQ's
--   creation lock and refused when anything holds it (_reserve_private_queues, PF004); then the flow
--   row is inserted without a default queue, the steps added, their persisted routes set, the
--   mode switched to 'step' and one private queue created per step (_create_private_queue).
--   A manual step (route queueName null) gets no private queue: its steps.queue_name keeps the
--   flow's default name, which no task of it ever uses (docs/manual-tasks.md).
-- Everything happens in the caller's transaction: a failure leaves nothing behind.
CREATE OR REPLACE FUNCTION pgflow._create_flow_from_shape(p_flow_slug text, p_shape jsonb, p_routes jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_step jsonb;
  v_opts jsonb;
  v_deps text[];
  v_alias text;
  v_queue text;
BEGIN
  IF p_shape IS NULL OR pg_catalog.jsonb_typeof(p_shape) <> 'object'
     OR pg_catalog.jsonb_typeof(p_shape -> 'steps') IS DISTINCT FROM 'array' THEN
    RAISE EXCEPTION 'flow "%": the shape must be a JSON object with a "steps" array', p_flow_slug
      USING ERRCODE = 'PF003';
  END IF;
  v_opts := coalesce(p_shape -> 'options', '{}'::jsonb);
  IF p_routes IS NULL THEN
    PERFORM pgflow.create_flow(
      p_flow_slug,
      max_attempts => (v_opts ->> 'maxAttempts')::integer,
      base_delay => (v_opts ->> 'baseDelay')::integer,
      timeout => (v_opts ->> 'timeout')::integer);
  ELSE
    SELECT f.flow_slug INTO v_alias FROM pgflow.flows AS f
    WHERE pg_catalog.lower(f.flow_slug COLLATE "C") = pg_catalog.lower(p_flow_slug COLLATE "C");
    IF FOUND THEN
      RAISE EXCEPTION 'flow slug "%" differs only by letter case from existing flow "%"', p_flow_slug, v_alias
        USING ERRCODE = 'PF003', HINT = 'flow slugs are unique ignoring case, because queue names are lowercase';
    END IF;
    PERFORM pgflow._reserve_private_queues(p_flow_slug, p_routes);
    -- add_step takes steps of plain flows only: the mode becomes 'step' once every route is set
    INSERT INTO pgflow.flows (flow_slug, opt_max_attempts, opt_base_delay, opt_timeout, queue_mode)
    VALUES (p_flow_slug, coalesce((v_opts ->> 'maxAttempts')::integer, 3), coalesce((v_opts ->> 'baseDelay')::integer, 5),
            coalesce((v_opts ->> 'timeout')::integer, 60), 'flow');
  END IF;

  FOR v_step IN SELECT e FROM pg_catalog.jsonb_array_elements(p_shape -> 'steps') WITH ORDINALITY AS x (e, n) ORDER BY n LOOP
    IF pg_catalog.jsonb_typeof(v_step) <> 'object' OR pg_catalog.jsonb_typeof(v_step -> 'slug') IS DISTINCT FROM 'string' THEN
      RAISE EXCEPTION 'flow "%": every shape step must be an object with a string "slug"', p_flow_slug
        USING ERRCODE = 'PF003';
    END IF;
    v_opts := coalesce(v_step -> 'options', '{}'::jsonb);
    SELECT coalesce(pg_catalog.array_agg(d), '{}') INTO v_deps
    FROM pg_catalog.jsonb_array_elements_text(coalesce(v_step -> 'dependencies', '[]'::jsonb)) AS d;
    PERFORM pgflow.add_step(
      flow_slug => p_flow_slug,
      step_slug => v_step ->> 'slug',
      deps_slugs => v_deps,
      max_attempts => (v_opts ->> 'maxAttempts')::integer,
      base_delay => (v_opts ->> 'baseDelay')::integer,
      timeout => (v_opts ->> 'timeout')::integer,
      start_delay => (v_opts ->> 'startDelay')::integer,
      step_type => coalesce(v_step ->> 'stepType', 'single'),
      required_input_pattern => CASE WHEN v_step -> 'requiredInputPattern' -> 'defined' = 'true'::jsonb
                                     THEN v_step -> 'requiredInputPattern' -> 'value' END,
      forbidden_input_pattern => CASE WHEN v_step -> 'forbiddenInputPattern' -> 'defined' = 'true'::jsonb
                                      THEN v_step -> 'forbiddenInputPattern' -> 'value' END,
      when_unmet => coalesce(v_step ->> 'whenUnmet', 'skip'),
      when_exhausted => coalesce(v_step ->> 'whenExhausted', 'fail'));
    IF v_step ->> 'executionMode' = 'manual' THEN
      PERFORM pgflow._set_step_manual(p_flow_slug, v_step ->> 'slug');
    END IF;
  END LOOP;

  IF p_routes IS NOT NULL THEN
    UPDATE pgflow.steps AS s
       SET queue_name = r ->> 'queueName'
      FROM pg_catalog.jsonb_array_elements(p_routes) AS r
     WHERE s.flow_slug = p_flow_slug AND s.step_slug = r ->> 'stepSlug' AND r ->> 'queueName' IS NOT NULL;
    UPDATE pgflow.flows AS f SET queue_mode = 'step' WHERE f.flow_slug = p_flow_slug;
    FOR v_queue IN SELECT s.queue_name FROM pgflow.steps AS s
                   WHERE s.flow_slug = p_flow_slug AND s.execution_mode = 'queue' ORDER BY s.step_index LOOP
      PERFORM pgflow._create_private_queue(p_flow_slug, v_queue);
    END LOOP;
  END IF;
END;
$$;

REVOKE ALL ON FUNCTION pgflow._create_flow_from_shape(text, jsonb, jsonb) FROM PUBLIC;

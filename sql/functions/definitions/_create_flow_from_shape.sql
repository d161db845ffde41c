-- Creates a flow and its steps from a worker's shape: create_flow + add_step per step, in order.
CREATE OR REPLACE FUNCTION pgflow._create_flow_from_shape(p_flow_slug text, p_shape jsonb)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_step jsonb;
  v_opts jsonb;
  v_deps text[];
BEGIN
  IF p_shape IS NULL OR pg_catalog.jsonb_typeof(p_shape) <> 'object'
     OR pg_catalog.jsonb_typeof(p_shape -> 'steps') IS DISTINCT FROM 'array' THEN
    RAISE EXCEPTION 'flow "%": the shape must be a JSON object with a "steps" array', p_flow_slug
      USING ERRCODE = 'PF003';
  END IF;
  v_opts := coalesce(p_shape -> 'options', '{}'::jsonb);
  PERFORM pgflow.create_flow(
    p_flow_slug,
    max_attempts => (v_opts ->> 'maxAttempts')::integer,
    base_delay => (v_opts ->> 'baseDelay')::integer,
    timeout => (v_opts ->> 'timeout')::integer);

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
END;
$$;

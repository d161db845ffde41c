-- Adds a step to a plain flow; its route is the flow's default queue. Idempotent for an existing
-- step. Refuses step slugs breaking the shared rules and case-only duplicates (PF003).
CREATE OR REPLACE FUNCTION pgflow.add_step(
  flow_slug text,
  step_slug text,
  deps_slugs text[] DEFAULT '{}',
  max_attempts integer DEFAULT NULL,
  base_delay integer DEFAULT NULL,
  timeout integer DEFAULT NULL,
  start_delay integer DEFAULT NULL,
  step_type text DEFAULT 'single',
  required_input_pattern jsonb DEFAULT NULL,
  forbidden_input_pattern jsonb DEFAULT NULL,
  when_unmet text DEFAULT 'skip',
  when_exhausted text DEFAULT 'fail'
)
RETURNS pgflow.steps
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_step pgflow.steps;
  v_flow pgflow.flows;
  v_deps text[];
  v_missing text[];
  v_index integer;
  v_reasons text[];
  v_twin text;
BEGIN
  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(pg_catalog.lower(add_step.flow_slug COLLATE "C")));
  PERFORM pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(add_step.flow_slug));

  SELECT f.* INTO v_flow FROM pgflow.flows AS f WHERE f.flow_slug = add_step.flow_slug;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'cannot add step "%": flow "%" does not exist', add_step.step_slug, add_step.flow_slug
      USING ERRCODE = 'PF003', HINT = 'create the flow first with pgflow.create_flow()';
  END IF;

  SELECT s.* INTO v_step FROM pgflow.steps AS s
  WHERE s.flow_slug = add_step.flow_slug AND s.step_slug = add_step.step_slug;
  IF FOUND THEN
    RETURN v_step;
  END IF;

  IF v_flow.queue_mode <> 'flow' THEN
    RAISE EXCEPTION 'flow "%" uses private step queues: its steps come only from compiling its complete definition',
      add_step.flow_slug
      USING ERRCODE = 'PF003';
  END IF;
  v_reasons := pgflow.slug_violations(add_step.step_slug);
  IF pg_catalog.cardinality(v_reasons) > 0 THEN
    RAISE EXCEPTION 'invalid step slug % in flow "%": %',
      coalesce(pg_catalog.quote_literal(add_step.step_slug), 'NULL'), add_step.flow_slug, pg_catalog.array_to_string(v_reasons, ', ')
      USING ERRCODE = 'PF003',
            HINT = 'flow and step slugs use ASCII letters, digits and single inner underscores, start with a letter, at most 128 characters';
  END IF;
  SELECT s.step_slug INTO v_twin FROM pgflow.steps AS s
  WHERE s.flow_slug = add_step.flow_slug
    AND pg_catalog.lower(s.step_slug COLLATE "C") = pg_catalog.lower(add_step.step_slug COLLATE "C");
  IF FOUND THEN
    RAISE EXCEPTION 'step slug "%" differs only by letter case from step "%" of flow "%"', add_step.step_slug, v_twin, add_step.flow_slug
      USING ERRCODE = 'PF003', HINT = 'step slugs are unique ignoring case within a flow';
  END IF;
  IF add_step.step_type IS NULL OR add_step.step_type NOT IN ('single', 'map') THEN
    RAISE EXCEPTION 'step "%" of flow "%": step_type must be ''single'' or ''map'', not %',
      add_step.step_slug, add_step.flow_slug, coalesce(pg_catalog.quote_literal(add_step.step_type), 'NULL')
      USING ERRCODE = 'PF003';
  END IF;
  IF add_step.when_unmet IS NULL OR add_step.when_unmet NOT IN ('fail', 'skip', 'skip-cascade')
     OR add_step.when_exhausted IS NULL OR add_step.when_exhausted NOT IN ('fail', 'skip', 'skip-cascade') THEN
    RAISE EXCEPTION 'step "%" of flow "%": when_unmet and when_exhausted must be fail, skip or skip-cascade',
      add_step.step_slug, add_step.flow_slug
      USING ERRCODE = 'PF003';
  END IF;
  IF (add_step.required_input_pattern IS NOT NULL AND pg_catalog.jsonb_typeof(add_step.required_input_pattern) <> 'object')
     OR (add_step.forbidden_input_pattern IS NOT NULL AND pg_catalog.jsonb_typeof(add_step.forbidden_input_pattern) <> 'object') THEN
    RAISE EXCEPTION 'step "%" of flow "%": input patterns must be JSON objects', add_step.step_slug, add_step.flow_slug
      USING ERRCODE = 'PF003';
  END IF;
  IF add_step.max_attempts < 0 OR add_step.base_delay < 0 OR add_step.timeout <= 0 OR add_step.start_delay < 0 THEN
    RAISE EXCEPTION 'step "%" of flow "%": max_attempts, base_delay and start_delay must be >= 0, timeout > 0',
      add_step.step_slug, add_step.flow_slug
      USING ERRCODE = 'PF003';
  END IF;

  SELECT coalesce(pg_catalog.array_agg(DISTINCT d ORDER BY d), '{}')
  INTO v_deps
  FROM pg_catalog.unnest(coalesce(add_step.deps_slugs, '{}')) AS d;
  IF pg_catalog.array_position(v_deps, NULL) IS NOT NULL OR add_step.step_slug = ANY (v_deps) THEN
    RAISE EXCEPTION 'step "%" of flow "%" cannot depend on NULL or on itself', add_step.step_slug, add_step.flow_slug
      USING ERRCODE = 'PF003';
  END IF;
  SELECT pg_catalog.array_agg(d ORDER BY d) INTO v_missing
  FROM pg_catalog.unnest(v_deps) AS d
  WHERE NOT EXISTS (SELECT 1 FROM pgflow.steps AS s WHERE s.flow_slug = add_step.flow_slug AND s.step_slug = d);
  IF v_missing IS NOT NULL THEN
    RAISE EXCEPTION 'step "%" of flow "%" depends on unknown step(s): %',
      add_step.step_slug, add_step.flow_slug, pg_catalog.array_to_string(v_missing, ', ')
      USING ERRCODE = 'PF003', HINT = 'add dependencies before the steps that use them';
  END IF;
  IF add_step.step_type = 'map' AND pg_catalog.cardinality(v_deps) > 1 THEN
    RAISE EXCEPTION 'map step "%" of flow "%" has % dependencies; a map step takes at most one',
      add_step.step_slug, add_step.flow_slug, pg_catalog.cardinality(v_deps)
      USING ERRCODE = 'PF003';
  END IF;

  SELECT coalesce(pg_catalog.max(s.step_index) + 1, 0) INTO v_index
  FROM pgflow.steps AS s WHERE s.flow_slug = add_step.flow_slug;

  INSERT INTO pgflow.steps (
    flow_slug, step_slug, step_type, step_index, deps_count,
    opt_max_attempts, opt_base_delay, opt_timeout, opt_start_delay,
    required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted, queue_name)
  VALUES (
    add_step.flow_slug, add_step.step_slug, add_step.step_type, v_index, pg_catalog.cardinality(v_deps),
    add_step.max_attempts, add_step.base_delay, add_step.timeout, add_step.start_delay,
    add_step.required_input_pattern, add_step.forbidden_input_pattern, add_step.when_unmet, add_step.when_exhausted,
    pgflow.default_queue_name(add_step.flow_slug))
  RETURNING * INTO v_step;

  INSERT INTO pgflow.deps (flow_slug, dep_slug, step_slug)
  SELECT add_step.flow_slug, d, add_step.step_slug
  FROM pg_catalog.unnest(v_deps) AS d;

  RETURN v_step;
END;
$$;

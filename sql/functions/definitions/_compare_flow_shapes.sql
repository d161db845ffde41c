-- Human-readable differences between a worker's shape (p_local) and the stored one (p_db).
-- Options never count; missing fields compare as their defaults.
CREATE OR REPLACE FUNCTION pgflow._compare_flow_shapes(p_local jsonb, p_db jsonb)
RETURNS text[]
LANGUAGE plpgsql
IMMUTABLE
SET search_path = ''
AS $$
DECLARE
  v_local jsonb := coalesce(p_local -> 'steps', '[]'::jsonb);
  v_db jsonb := coalesce(p_db -> 'steps', '[]'::jsonb);
  v_diffs text[] := '{}';
  v_a jsonb;
  v_b jsonb;
  v_slug text;
  v_deps_a jsonb;
  v_deps_b jsonb;
  v_pat_a jsonb;
  v_pat_b jsonb;
  i integer;
BEGIN
  IF pg_catalog.jsonb_typeof(v_local) <> 'array' OR pg_catalog.jsonb_typeof(v_db) <> 'array' THEN
    RAISE EXCEPTION '_compare_flow_shapes(): "steps" must be a JSON array' USING ERRCODE = 'PF003';
  END IF;
  IF pg_catalog.jsonb_array_length(v_local) <> pg_catalog.jsonb_array_length(v_db) THEN
    -- released pgflow's exact text, worker's count first (its tests pin it)
    v_diffs := v_diffs || pg_catalog.format('Step count differs: %s vs %s',
                                            pg_catalog.jsonb_array_length(v_local), pg_catalog.jsonb_array_length(v_db));
  END IF;
  FOR i IN 0 .. GREATEST(pg_catalog.jsonb_array_length(v_local), pg_catalog.jsonb_array_length(v_db)) - 1 LOOP
    v_a := v_local -> i;
    v_b := v_db -> i;
    IF v_b IS NULL THEN
      v_diffs := v_diffs || pg_catalog.format('step %s: "%s" is defined by the worker but missing in the database', i, v_a ->> 'slug');
      CONTINUE;
    END IF;
    IF v_a IS NULL THEN
      v_diffs := v_diffs || pg_catalog.format('step %s: "%s" exists in the database but not in the worker definition', i, v_b ->> 'slug');
      CONTINUE;
    END IF;
    v_slug := v_b ->> 'slug';
    IF (v_a ->> 'slug') IS DISTINCT FROM v_slug THEN
      v_diffs := v_diffs || pg_catalog.format('step %s: slug differs: worker "%s", database "%s"', i, v_a ->> 'slug', v_slug);
    END IF;
    IF coalesce(v_a ->> 'stepType', 'single') IS DISTINCT FROM coalesce(v_b ->> 'stepType', 'single') THEN
      v_diffs := v_diffs || pg_catalog.format('step %s ("%s"): step type differs: worker %s, database %s', i, v_slug,
                                              coalesce(v_a ->> 'stepType', 'single'), coalesce(v_b ->> 'stepType', 'single'));
    END IF;
    IF coalesce(v_a ->> 'executionMode', 'queue') IS DISTINCT FROM coalesce(v_b ->> 'executionMode', 'queue') THEN
      v_diffs := v_diffs || pg_catalog.format('step %s ("%s"): execution mode differs: worker %s, database %s', i, v_slug,
                                              coalesce(v_a ->> 'executionMode', 'queue'), coalesce(v_b ->> 'executionMode', 'queue'));
    END IF;
    SELECT coalesce(pg_catalog.jsonb_agg(x ORDER BY x), '[]'::jsonb) INTO v_deps_a
    FROM pg_catalog.jsonb_array_elements_text(coalesce(v_a -> 'dependencies', '[]'::jsonb)) AS x;
    SELECT coalesce(pg_catalog.jsonb_agg(x ORDER BY x), '[]'::jsonb) INTO v_deps_b
    FROM pg_catalog.jsonb_array_elements_text(coalesce(v_b -> 'dependencies', '[]'::jsonb)) AS x;
    IF v_deps_a IS DISTINCT FROM v_deps_b THEN
      v_diffs := v_diffs || pg_catalog.format('step %s ("%s"): dependencies differ: worker %s, database %s', i, v_slug, v_deps_a, v_deps_b);
    END IF;
    IF coalesce(v_a ->> 'whenUnmet', 'skip') IS DISTINCT FROM coalesce(v_b ->> 'whenUnmet', 'skip') THEN
      v_diffs := v_diffs || pg_catalog.format('step %s ("%s"): whenUnmet differs: worker %s, database %s', i, v_slug,
                                              coalesce(v_a ->> 'whenUnmet', 'skip'), coalesce(v_b ->> 'whenUnmet', 'skip'));
    END IF;
    IF coalesce(v_a ->> 'whenExhausted', 'fail') IS DISTINCT FROM coalesce(v_b ->> 'whenExhausted', 'fail') THEN
      v_diffs := v_diffs || pg_catalog.format('step %s ("%s"): whenExhausted differs: worker %s, database %s', i, v_slug,
                                              coalesce(v_a ->> 'whenExhausted', 'fail'), coalesce(v_b ->> 'whenExhausted', 'fail'));
    END IF;
    v_pat_a := pgflow._normalize_shape_pattern(v_a -> 'requiredInputPattern');
    v_pat_b := pgflow._normalize_shape_pattern(v_b -> 'requiredInputPattern');
    IF v_pat_a IS DISTINCT FROM v_pat_b THEN
      v_diffs := v_diffs || pg_catalog.format('step %s ("%s"): requiredInputPattern (if) differs: worker %s, database %s', i, v_slug, v_pat_a, v_pat_b);
    END IF;
    v_pat_a := pgflow._normalize_shape_pattern(v_a -> 'forbiddenInputPattern');
    v_pat_b := pgflow._normalize_shape_pattern(v_b -> 'forbiddenInputPattern');
    IF v_pat_a IS DISTINCT FROM v_pat_b THEN
      v_diffs := v_diffs || pg_catalog.format('step %s ("%s"): forbiddenInputPattern (ifNot) differs: worker %s, database %s', i, v_slug, v_pat_a, v_pat_b);
    END IF;
  END LOOP;
  RETURN v_diffs;
END;
$$;

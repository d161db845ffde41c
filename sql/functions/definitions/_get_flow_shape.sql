-- The structural shape of a stored flow (options excluded); {"steps": []} for a flow without
-- steps and for an unknown one, as released pgflow answers (docs/compatibility.md item 3).
CREATE OR REPLACE FUNCTION pgflow._get_flow_shape(p_flow_slug text)
RETURNS jsonb
LANGUAGE sql
STABLE
SET search_path = ''
AS $$
  SELECT pg_catalog.jsonb_build_object('steps', coalesce((
    SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
             'slug', s.step_slug,
             'stepType', s.step_type,
             'dependencies', coalesce((
               SELECT pg_catalog.jsonb_agg(d.dep_slug ORDER BY d.dep_slug)
               FROM pgflow.deps AS d
               WHERE d.flow_slug = s.flow_slug AND d.step_slug = s.step_slug), '[]'::jsonb),
             'whenUnmet', s.when_unmet,
             'whenExhausted', s.when_exhausted,
             'requiredInputPattern', CASE WHEN s.required_input_pattern IS NULL
                                          THEN '{"defined": false}'::jsonb
                                          ELSE pg_catalog.jsonb_build_object('defined', true, 'value', s.required_input_pattern) END,
             'forbiddenInputPattern', CASE WHEN s.forbidden_input_pattern IS NULL
                                           THEN '{"defined": false}'::jsonb
                                           ELSE pg_catalog.jsonb_build_object('defined', true, 'value', s.forbidden_input_pattern) END)
           ORDER BY s.step_index)
    FROM pgflow.steps AS s
    WHERE s.flow_slug = p_flow_slug), '[]'::jsonb))
$$;

-- A pattern wrapper in comparable form: {"defined": false} or {"defined": true, "value": ...}.
CREATE OR REPLACE FUNCTION pgflow._normalize_shape_pattern(p_wrapper jsonb)
RETURNS jsonb
LANGUAGE sql
IMMUTABLE
SET search_path = ''
AS $$
  SELECT CASE
    WHEN p_wrapper IS NULL OR pg_catalog.jsonb_typeof(p_wrapper) <> 'object'
         OR NOT coalesce(p_wrapper -> 'defined' = 'true'::jsonb, false)
      THEN '{"defined": false}'::jsonb
    ELSE pg_catalog.jsonb_build_object('defined', true, 'value', p_wrapper -> 'value')
  END
$$;

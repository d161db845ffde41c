CREATE OR REPLACE FUNCTION pgflow.is_valid_slug(slug text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = ''
AS $$
  SELECT pg_catalog.cardinality(pgflow.slug_violations($1)) = 0
$$;

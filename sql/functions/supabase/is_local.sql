-- True only when the database (or session) setting pgflow.environment is 'local'. Unset means
-- production, the safe default.
CREATE OR REPLACE FUNCTION pgflow.is_local()
RETURNS boolean
LANGUAGE sql
STABLE
SET search_path = ''
AS $$
  SELECT coalesce(pg_catalog.current_setting('pgflow.environment', true), '') = 'local'
$$;

-- Every rule a flow or step slug breaks, as stable reason codes in a fixed order (empty = valid).
-- The body is the shared fragment that `pgflow audit` and pgflow_cli.naming also implement.
CREATE OR REPLACE FUNCTION pgflow.slug_violations(slug text)
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = ''
AS $$
  WITH slug_input AS (SELECT $1 AS slug), checked AS (
--@include fragments/slug_violations.sql
  )
  SELECT checked.reasons FROM checked
$$;

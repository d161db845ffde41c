-- Whether this database (or session) is a local development stack, where startup compilation
-- may delete and recompile a changed flow and ensure_workers() pings every enabled function.
-- In this order (docs/compatibility.md item 1):
--   pgflow.environment = 'local'                 -> true
--   pgflow.environment set to anything else      -> false (an explicit choice wins)
--   pgflow.environment unset or empty            -> true exactly when app.settings.jwt_secret is
--                                                   the Supabase CLI's local JWT secret (the
--                                                   detection released pgflow uses)
CREATE OR REPLACE FUNCTION pgflow.is_local()
RETURNS boolean
LANGUAGE sql
STABLE
SET search_path = ''
AS $$
  SELECT CASE coalesce(pg_catalog.current_setting('pgflow.environment', true), '')
           WHEN 'local' THEN true
           WHEN '' THEN coalesce(pg_catalog.current_setting('app.settings.jwt_secret', true), '')
                        = 'super-secret-jwt-token-with-at-least-32-characters-long'
           ELSE false
         END
$$;

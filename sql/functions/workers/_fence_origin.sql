-- Who is changing a fence: the current role, the session's application_name and the client
-- address ('local' for a Unix socket). pgflow-cli puts the operating-system user and host into
-- application_name ("pgflow fence (alice@deploy-1)").
CREATE OR REPLACE FUNCTION pgflow._fence_origin(OUT who text, OUT application text, OUT client text)
LANGUAGE sql
STABLE
SET search_path = ''
AS $$
  SELECT CASE WHEN SESSION_USER = CURRENT_USER THEN CURRENT_USER::text
              ELSE pg_catalog.format('%s (session %s)', CURRENT_USER, SESSION_USER) END,
         nullif(pg_catalog.current_setting('application_name', true), ''),
         coalesce(pg_catalog.host(pg_catalog.inet_client_addr()), 'local')
$$;

REVOKE ALL ON FUNCTION pgflow._fence_origin() FROM PUBLIC;

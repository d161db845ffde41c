-- Optional HTTP starter (Supabase Edge Functions). Needs pg_net; in production also vault
-- secrets (pgflow_auth_secret or supabase_service_role_key, and supabase_project_id) unless
-- pgflow.functions_url is set. Without them it returns no rows and does nothing. Pings every
-- enabled function (fenced functions never) that, in production, has no live worker and whose
-- debounce has passed; locally every enabled function. pg_net and vault are reached only
-- through dynamic SQL after a catalog check.
CREATE OR REPLACE FUNCTION pgflow.ensure_workers()
RETURNS TABLE (function_name text, invoked boolean, request_id bigint)
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_local boolean := pgflow.is_local();
  v_url text := nullif(pg_catalog.current_setting('pgflow.functions_url', true), '');
  v_secret text;
  v_project text;
  v_fn text;
  v_request bigint;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS p
                 JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
                 WHERE n.nspname = 'net' AND p.proname = 'http_post') THEN
    RETURN;
  END IF;

  IF pg_catalog.to_regclass('vault.decrypted_secrets') IS NOT NULL THEN
    EXECUTE $q$
      SELECT coalesce(nullif(pg_catalog.max(s.decrypted_secret) FILTER (WHERE s.name = 'pgflow_auth_secret'), ''),
                      nullif(pg_catalog.max(s.decrypted_secret) FILTER (WHERE s.name = 'supabase_service_role_key'), '')),
             nullif(pg_catalog.max(s.decrypted_secret) FILTER (WHERE s.name = 'supabase_project_id'), '')
      FROM vault.decrypted_secrets AS s
      WHERE s.name IN ('pgflow_auth_secret', 'supabase_service_role_key', 'supabase_project_id')
    $q$ INTO v_secret, v_project;
  END IF;

  IF v_local THEN
    v_url := coalesce(v_url, 'http://kong:8000/functions/v1');
    v_secret := NULL;
  ELSE
    IF v_url IS NULL AND v_project IS NOT NULL THEN
      v_url := 'https://' || v_project || '.supabase.co/functions/v1';
    END IF;
    IF v_url IS NULL OR v_secret IS NULL THEN
      RETURN;
    END IF;
  END IF;

  FOR v_fn IN
    SELECT wf.function_name
    FROM pgflow.worker_functions AS wf
    WHERE wf.enabled
      AND (v_local
           OR ((wf.last_invoked_at IS NULL OR wf.last_invoked_at < pg_catalog.now() - wf.debounce)
               AND NOT EXISTS (SELECT 1 FROM pgflow.workers AS w
                               WHERE w.function_name = wf.function_name
                                 AND w.stopped_at IS NULL AND w.deprecated_at IS NULL
                                 AND w.last_heartbeat_at > pg_catalog.now() - wf.debounce)))
    ORDER BY wf.function_name
    FOR UPDATE OF wf SKIP LOCKED
  LOOP
    EXECUTE 'SELECT net.http_post(url => $1, body => $2, headers => $3)'
      INTO v_request
      USING v_url || '/' || v_fn,
            '{}'::jsonb,
            pg_catalog.jsonb_build_object('Content-Type', 'application/json')
              || CASE WHEN v_secret IS NULL THEN '{}'::jsonb
                      ELSE pg_catalog.jsonb_build_object('Authorization', 'Bearer ' || v_secret) END;
    UPDATE pgflow.worker_functions AS wf SET last_invoked_at = pg_catalog.clock_timestamp()
     WHERE wf.function_name = v_fn;
    function_name := v_fn;
    invoked := true;
    request_id := v_request;
    RETURN NEXT;
  END LOOP;
END;
$$;

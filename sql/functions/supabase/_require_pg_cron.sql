-- Raises a clear error when pg_cron is not installed.
CREATE OR REPLACE FUNCTION pgflow._require_pg_cron()
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = ''
AS $$
BEGIN
  IF pg_catalog.to_regclass('cron.job') IS NULL
     OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS p
                    JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
                    WHERE n.nspname = 'cron' AND p.proname = 'schedule') THEN
    RAISE EXCEPTION 'pg_cron is not installed in this database, so pgflow cannot schedule jobs'
      USING ERRCODE = '0A000',
            HINT = 'install pg_cron (CREATE EXTENSION pg_cron), or run the function from your own scheduler';
  END IF;
END;
$$;

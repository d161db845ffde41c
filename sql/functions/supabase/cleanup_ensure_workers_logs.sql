-- Deletes pg_cron run history older than retention_hours; 0 when pg_cron is not installed.
CREATE OR REPLACE FUNCTION pgflow.cleanup_ensure_workers_logs(retention_hours integer DEFAULT 24)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = ''
AS $$
DECLARE
  v_count integer;
BEGIN
  IF pg_catalog.to_regclass('cron.job_run_details') IS NULL THEN
    RETURN 0;
  END IF;
  EXECUTE 'DELETE FROM cron.job_run_details AS d WHERE d.end_time < pg_catalog.now() - pg_catalog.make_interval(hours => $1)'
    USING retention_hours;
  GET DIAGNOSTICS v_count = ROW_COUNT;
  RETURN v_count;
END;
$$;

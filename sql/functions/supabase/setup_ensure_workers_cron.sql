-- Schedules pgflow_ensure_workers and the hourly pgflow_cleanup_logs (pg_cron; idempotent).
CREATE OR REPLACE FUNCTION pgflow.setup_ensure_workers_cron(cron_interval text DEFAULT '1 second')
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = ''
AS $$
BEGIN
  PERFORM pgflow._require_pg_cron();
  EXECUTE 'SELECT cron.unschedule(j.jobid) FROM cron.job AS j WHERE j.jobname = ANY ($1)'
    USING ARRAY['pgflow_ensure_workers', 'pgflow_cleanup_logs'];
  EXECUTE 'SELECT cron.schedule($1, $2, $3)'
    USING 'pgflow_ensure_workers', cron_interval, 'SELECT pgflow.ensure_workers()';
  EXECUTE 'SELECT cron.schedule($1, $2, $3)'
    USING 'pgflow_cleanup_logs', '0 * * * *', 'SELECT pgflow.cleanup_ensure_workers_logs()';
  RETURN 'scheduled pgflow_ensure_workers every ' || cron_interval || ' and pgflow_cleanup_logs hourly';
END;
$$;

-- Schedules pgflow_requeue_stalled_tasks (pg_cron; idempotent).
CREATE OR REPLACE FUNCTION pgflow.setup_requeue_stalled_tasks_cron(cron_interval text DEFAULT '15 seconds')
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = ''
AS $$
BEGIN
  PERFORM pgflow._require_pg_cron();
  EXECUTE 'SELECT cron.unschedule(j.jobid) FROM cron.job AS j WHERE j.jobname = $1'
    USING 'pgflow_requeue_stalled_tasks';
  EXECUTE 'SELECT cron.schedule($1, $2, $3)'
    USING 'pgflow_requeue_stalled_tasks', cron_interval, 'SELECT pgflow.requeue_stalled_tasks()';
  RETURN 'scheduled pgflow_requeue_stalled_tasks every ' || cron_interval;
END;
$$;

-- Optional pruning for the released baseline (0002). Not a migration: install it on request,
-- e.g. psql -f sql/optional/prune_baseline.sql, and schedule it yourself (weekly is plenty;
-- a 90-day retention is a sensible start).
--
--   SELECT pgflow.prune_data_older_than(interval '90 days');
--
-- What it deletes, older than now() - retention_interval:
--   1. workers whose last heartbeat is older than the cutoff (step_tasks.last_worker_id is
--      cleared by its ON DELETE SET NULL foreign key);
--   2. finished runs (completed_at or failed_at older than the cutoff) with their step_states
--      and step_tasks; messages those tasks still have in a queue (possible only in data from
--      before the 0.15.1 fixes) are archived first through pgflow._archive_task_messages, so
--      this file follows whatever queue identity the installed runtime uses;
--   3. archived messages (archived_at older than the cutoff) of every flow's queue, when that
--      archive table exists.
-- Started runs, flows and steps are never touched. Returns a JSON summary of what it removed.
--
-- Lock order, as in the runtime: runs (FOR UPDATE SKIP LOCKED, so a run somebody is still
-- writing to is left for the next prune) -> step_tasks -> queue rows -> row deletion ->
-- archive tables.
--
-- The queue-identity migration (0003) ships its own version of this file; reinstalling this one
-- over it would bring back the flow-slug archive lookup of step 3.

-- CREATE OR REPLACE keeps the grants an installed version has (a schedule running as a granted
-- role keeps working); only a version with another return type has to be dropped first.
DO $replace$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS p
             WHERE p.oid = pg_catalog.to_regprocedure('pgflow.prune_data_older_than(interval)')
               AND p.prorettype <> 'jsonb'::regtype) THEN
    DROP FUNCTION pgflow.prune_data_older_than(interval);
  END IF;
END
$replace$;

CREATE OR REPLACE FUNCTION pgflow.prune_data_older_than(retention_interval interval)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_cutoff timestamptz;
  v_workers integer;
  v_runs uuid[];
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes integer[];
  v_messages integer;
  v_tasks integer;
  v_states integer;
  v_deleted_runs integer;
  v_flow text;
  v_table text;
  v_count integer;
  v_archived integer := 0;
BEGIN
  IF retention_interval IS NULL OR retention_interval < interval '0' THEN
    RAISE EXCEPTION 'prune_data_older_than(): retention_interval must be a non-negative interval, got %',
      coalesce(retention_interval::text, 'NULL')
      USING ERRCODE = '22023';
  END IF;
  v_cutoff := pg_catalog.now() - retention_interval;

  DELETE FROM pgflow.workers AS w WHERE w.last_heartbeat_at < v_cutoff;
  GET DIAGNOSTICS v_workers = ROW_COUNT;

  SELECT pg_catalog.array_agg(x.run_id) INTO v_runs
  FROM (
    SELECT r.run_id
    FROM pgflow.runs AS r
    WHERE (r.status = 'completed' AND r.completed_at < v_cutoff)
       OR (r.status = 'failed' AND r.failed_at < v_cutoff)
    ORDER BY r.run_id
    FOR UPDATE SKIP LOCKED
  ) AS x;

  IF v_runs IS NOT NULL THEN
    WITH live AS (
      SELECT t.run_id, t.step_slug, t.task_index
      FROM pgflow.step_tasks AS t
      WHERE t.run_id = ANY (v_runs) AND t.status IN ('queued', 'started') AND t.message_id IS NOT NULL
      ORDER BY t.run_id, t.step_slug, t.task_index
      FOR UPDATE
    )
    SELECT pg_catalog.array_agg(l.run_id), pg_catalog.array_agg(l.step_slug), pg_catalog.array_agg(l.task_index)
    INTO v_run_ids, v_step_slugs, v_task_indexes
    FROM live AS l;
    v_messages := pgflow._archive_task_messages(v_run_ids, v_step_slugs, v_task_indexes);

    DELETE FROM pgflow.step_tasks AS t WHERE t.run_id = ANY (v_runs);
    GET DIAGNOSTICS v_tasks = ROW_COUNT;
    DELETE FROM pgflow.step_states AS ss WHERE ss.run_id = ANY (v_runs);
    GET DIAGNOSTICS v_states = ROW_COUNT;
    DELETE FROM pgflow.runs AS r WHERE r.run_id = ANY (v_runs);
    GET DIAGNOSTICS v_deleted_runs = ROW_COUNT;
  END IF;

  -- Baseline queue naming: one queue per flow, named like the flow.
  FOR v_flow IN SELECT f.flow_slug FROM pgflow.flows AS f ORDER BY f.flow_slug LOOP
    v_table := pgmq.format_table_name(v_flow, 'a');
    IF pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', v_table)) IS NOT NULL THEN
      EXECUTE pg_catalog.format('DELETE FROM pgmq.%I AS a WHERE a.archived_at < $1', v_table) USING v_cutoff;
      GET DIAGNOSTICS v_count = ROW_COUNT;
      v_archived := v_archived + v_count;
    END IF;
  END LOOP;

  RETURN pg_catalog.jsonb_build_object(
    'cutoff', v_cutoff,
    'workers', v_workers,
    'runs', coalesce(v_deleted_runs, 0),
    'step_states', coalesce(v_states, 0),
    'step_tasks', coalesce(v_tasks, 0),
    'live_messages_archived', coalesce(v_messages, 0),
    'archived_messages', v_archived);
END;
$$;

REVOKE ALL ON FUNCTION pgflow.prune_data_older_than(interval) FROM PUBLIC;

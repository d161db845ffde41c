-- One batch of `pgflow prune` (docs/commands/prune.md): the next page of runs by primary key after
-- p_after, and of those the finished ones that ended before p_cutoff, deleted with their step
-- states and tasks in the caller's transaction (one short transaction per batch).
--
--   p_cutoff      runs that completed or failed before this moment go (a started run never does);
--   p_after       the last run_id of the previous batch (the keyset cursor), NULL to start;
--   p_batch_size  runs per page, 1 to 10000; a page holds runs of every state, so a batch deletes at
--                 most this many runs with all their step states and tasks;
--   p_dry_run     count what this page would delete; change and lock nothing.
--
-- Locks, in the runtime's order (docs/runtime.md "Lock order"): the page's finished runs
-- FOR UPDATE SKIP LOCKED (a run a late report or a claim holds is left for the next prune and
-- counted in skipped_locked: pruning never waits for a worker, and a worker waits at most one
-- batch for a run being pruned), then the tasks and step states of those runs as they are deleted.
-- No queue row is touched: a finished run has no message left in a queue (docs/runtime.md
-- "Invariants"); a finished run that still has a queued or started task (data written before the
-- truthful-terminal-state fixes) is kept and counted in kept_open_tasks, never deleted.
--
-- Resumable: a batch deletes whole runs (or nothing, when its transaction is rolled back), so a
-- prune that was stopped is simply run again; pages already pruned are found empty at once.
--
-- Returns jsonb {"last_run_id": the page's last run_id (the next p_after) or NULL when the page
-- was empty, "scanned": runs in the page, "runs", "step_states", "step_tasks": rows deleted (or,
-- dry run, that would be), "runs_by_status": {"completed": n, "failed": n}, "skipped_locked",
-- "kept_open_tasks", "done": true when no run is left after this page}.
-- Errors: 22023 a NULL cutoff or a batch size outside 1..10000.
-- Operator only: anyone but the owner of the pgflow tables or a member of pgflow_operator gets 42501
-- (pgflow._require_caller; a worker holds EXECUTE on every function, so the grant cannot tell them apart).
CREATE OR REPLACE FUNCTION pgflow.prune_runs(p_cutoff timestamptz, p_after uuid, p_batch_size integer,
                                             p_dry_run boolean DEFAULT false)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_page uuid[];
  v_last uuid;
  v_ended uuid[];
  v_open uuid[];
  v_runs uuid[];
  v_tasks integer := 0;
  v_states integer := 0;
  v_completed integer := 0;
  v_failed integer := 0;
BEGIN
  PERFORM pgflow._require_caller('pgflow_operator', 'prune runs');
  IF p_cutoff IS NULL OR p_batch_size IS NULL OR p_batch_size NOT BETWEEN 1 AND 10000 THEN
    RAISE EXCEPTION 'prune_runs(): the cutoff must be a time and the batch size 1 to 10000, got % and %',
      coalesce(p_cutoff::text, 'NULL'), coalesce(p_batch_size::text, 'NULL')
      USING ERRCODE = '22023';
  END IF;

  -- The keyset page: walking the primary key visits every run once however many are started, so a
  -- whole prune reads the table once and each batch reads at most p_batch_size runs.
  SELECT pg_catalog.array_agg(p.run_id ORDER BY p.run_id) INTO v_page
  FROM (SELECT r.run_id FROM pgflow.runs AS r
        WHERE p_after IS NULL OR r.run_id > p_after
        ORDER BY r.run_id
        LIMIT p_batch_size) AS p;
  IF v_page IS NULL THEN
    RETURN pg_catalog.jsonb_build_object(
      'last_run_id', NULL, 'scanned', 0, 'runs', 0, 'step_states', 0, 'step_tasks', 0,
      'runs_by_status', pg_catalog.jsonb_build_object('completed', 0, 'failed', 0),
      'skipped_locked', 0, 'kept_open_tasks', 0, 'done', true);
  END IF;
  v_last := v_page[pg_catalog.array_length(v_page, 1)];

  -- Finished before the cutoff, as seen now (no lock).
  SELECT pg_catalog.array_agg(r.run_id ORDER BY r.run_id) INTO v_ended
  FROM pgflow.runs AS r
  WHERE r.run_id = ANY (v_page)
    AND ((r.status = 'completed' AND r.completed_at < p_cutoff) OR (r.status = 'failed' AND r.failed_at < p_cutoff));

  -- Of those, the ones with a task still queued or started stay (see the header).
  SELECT pg_catalog.array_agg(DISTINCT t.run_id) INTO v_open
  FROM pgflow.step_tasks AS t
  WHERE t.run_id = ANY (v_ended) AND t.status IN ('queued', 'started');

  IF p_dry_run THEN
    SELECT pg_catalog.array_agg(e.run_id) INTO v_runs
    FROM pg_catalog.unnest(v_ended) AS e (run_id)
    WHERE NOT e.run_id = ANY (coalesce(v_open, '{}'));
  ELSE
    -- The recheck of FOR UPDATE reads each row's newest version: a run is deleted only if it is
    -- still finished before the cutoff once locked.
    SELECT pg_catalog.array_agg(x.run_id ORDER BY x.run_id) INTO v_runs
    FROM (SELECT r.run_id FROM pgflow.runs AS r
          WHERE r.run_id = ANY (v_ended) AND NOT r.run_id = ANY (coalesce(v_open, '{}'))
            AND ((r.status = 'completed' AND r.completed_at < p_cutoff)
                 OR (r.status = 'failed' AND r.failed_at < p_cutoff))
          ORDER BY r.run_id
          FOR UPDATE SKIP LOCKED) AS x;
  END IF;

  IF v_runs IS NOT NULL THEN
    SELECT pg_catalog.count(*) FILTER (WHERE r.status = 'completed'),
           pg_catalog.count(*) FILTER (WHERE r.status = 'failed')
      INTO v_completed, v_failed
    FROM pgflow.runs AS r WHERE r.run_id = ANY (v_runs);
    IF p_dry_run THEN
      SELECT pg_catalog.count(*) INTO v_tasks FROM pgflow.step_tasks AS t WHERE t.run_id = ANY (v_runs);
      SELECT pg_catalog.count(*) INTO v_states FROM pgflow.step_states AS ss WHERE ss.run_id = ANY (v_runs);
    ELSE
      DELETE FROM pgflow.step_tasks AS t WHERE t.run_id = ANY (v_runs);
      GET DIAGNOSTICS v_tasks = ROW_COUNT;
      DELETE FROM pgflow.step_states AS ss WHERE ss.run_id = ANY (v_runs);
      GET DIAGNOSTICS v_states = ROW_COUNT;
      DELETE FROM pgflow.runs AS r WHERE r.run_id = ANY (v_runs);
    END IF;
  END IF;

  RETURN pg_catalog.jsonb_build_object(
    'last_run_id', v_last,
    'scanned', pg_catalog.array_length(v_page, 1),
    'runs', v_completed + v_failed,
    'step_states', v_states,
    'step_tasks', v_tasks,
    'runs_by_status', pg_catalog.jsonb_build_object('completed', v_completed, 'failed', v_failed),
    'skipped_locked', coalesce(pg_catalog.array_length(v_ended, 1), 0) - coalesce(pg_catalog.array_length(v_open, 1), 0)
                      - coalesce(pg_catalog.array_length(v_runs, 1), 0),
    'kept_open_tasks', coalesce(pg_catalog.array_length(v_open, 1), 0),
    'done', pg_catalog.array_length(v_page, 1) < p_batch_size);
END;
$$;

REVOKE ALL ON FUNCTION pgflow.prune_runs(timestamptz, uuid, integer, boolean) FROM PUBLIC;

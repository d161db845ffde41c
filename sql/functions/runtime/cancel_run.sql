-- Cancels a started run on an operator's word: the run ends failed with the reason recorded
-- (a row of pgflow.run_cancellations: cancelled_at, reason, cancelled_by); every step with work
-- in flight (started) fails with the error "[CANCELLED] <reason>"; every queued or started task of the run, manual ones included,
-- becomes cancelled and the messages of the queue-backed ones are archived; the step and run
-- events go out (realtime). Steps that never started stay created, as when a run fails.
-- Locks in the runtime's order: the run row FOR UPDATE (so it takes turns with every report,
-- claim and manual completion of the run, which lock it first), then its step states, its tasks,
-- and last the queue rows through the helper. A worker report that arrives afterwards is a late
-- report: refused and counted on its task (step_tasks.refused_reports, _lock_worker_task);
-- complete_manual_task / fail_manual_task raise PF011 (not active).
-- Parameters: run_id, the run; reason, why (free text, at most 1000 characters; NULL or blank:
-- "cancelled by <role>").
-- Returns the run as it is now. A run cancelled already is returned unchanged (a second cancel,
-- e.g. from another connection at the same moment, changes nothing).
-- Raises: 42501 the caller is not an operator (_require_caller); PF006 no such run; PF013 the
-- run already ended (completed, or failed on its own); 22023 a reason longer than 1000 characters.
CREATE OR REPLACE FUNCTION pgflow.cancel_run(run_id uuid, reason text DEFAULT NULL)
RETURNS pgflow.runs
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_reason text := coalesce(NULLIF(pg_catalog.btrim(cancel_run.reason), ''), 'cancelled by ' || current_user);
  v_run pgflow.runs;
  v_now timestamptz;
  v_states pgflow.step_states[];
  v_run_ids uuid[];
  v_step_slugs text[];
  v_task_indexes integer[];
BEGIN
  PERFORM pgflow._require_caller('pgflow_operator', 'cancel runs');
  IF pg_catalog.char_length(v_reason) > 1000 THEN
    RAISE EXCEPTION 'cancel_run(): the reason is % characters long; at most 1000 are kept', pg_catalog.char_length(v_reason)
      USING ERRCODE = '22023';
  END IF;

  SELECT r.* INTO v_run FROM pgflow.runs AS r WHERE r.run_id = cancel_run.run_id FOR UPDATE;
  IF v_run.run_id IS NULL THEN
    RAISE EXCEPTION 'run % does not exist', cancel_run.run_id
      USING ERRCODE = 'PF006', HINT = 'pgflow runs list shows the runs';
  END IF;
  -- the run's row lock orders cancels: a second one finds the first's row and changes nothing
  IF EXISTS (SELECT 1 FROM pgflow.run_cancellations AS c WHERE c.run_id = v_run.run_id) THEN
    RETURN v_run;
  END IF;
  IF v_run.status <> 'started' THEN
    RAISE EXCEPTION 'run % already %; there is nothing to cancel', v_run.run_id, v_run.status
      USING ERRCODE = 'PF013',
            HINT = CASE WHEN v_run.status = 'failed' THEN 'a failed run can be retried or resumed (pgflow runs retry|resume)'
                        ELSE 'a completed run stays completed' END;
  END IF;

  -- the moment the run lock was granted, not the transaction's start: every report applied before
  -- the cancel committed before this moment, so cancelled_at orders them truthfully
  v_now := pg_catalog.clock_timestamp();
  UPDATE pgflow.runs AS r
     SET status = 'failed', failed_at = v_now
   WHERE r.run_id = v_run.run_id
  RETURNING r.* INTO v_run;
  INSERT INTO pgflow.run_cancellations (run_id, cancelled_at, reason, cancelled_by)
  VALUES (v_run.run_id, v_now, v_reason, current_user);

  WITH failed AS (
    UPDATE pgflow.step_states AS ss
       SET status = 'failed', failed_at = v_now, error_message = '[CANCELLED] ' || v_reason
     WHERE ss.run_id = v_run.run_id AND ss.status = 'started'
    RETURNING ss AS state, ss.step_slug
  )
  SELECT pg_catalog.array_agg(f.state ORDER BY f.step_slug) INTO v_states FROM failed AS f;

  WITH cancelled AS (
    UPDATE pgflow.step_tasks AS t
       SET status = 'cancelled'
     WHERE t.run_id = v_run.run_id AND t.status IN ('queued', 'started')
    RETURNING t.run_id, t.step_slug, t.task_index
  )
  SELECT pg_catalog.array_agg(c.run_id), pg_catalog.array_agg(c.step_slug), pg_catalog.array_agg(c.task_index)
  INTO v_run_ids, v_step_slugs, v_task_indexes
  FROM cancelled AS c;
  PERFORM pgflow._archive_task_messages(v_run_ids, v_step_slugs, v_task_indexes);

  FOR v_i IN 1 .. coalesce(pg_catalog.cardinality(v_states), 0) LOOP
    PERFORM pgflow._broadcast_step(v_states[v_i]);
  END LOOP;
  PERFORM pgflow._broadcast_run(v_run, '[CANCELLED] ' || v_reason);
  RETURN v_run;
END;
$$;

-- The source run of retry_run / resume_run, locked for the restart in the runtime's order: the
-- flow advisory lock in shared mode first (as every run start takes it: no restart while the flow
-- is recompiled or deleted), then the source's run row FOR SHARE (it cannot be deleted or pruned
-- under the restart; two restarts of one run do not block each other).
-- p_function names the entry point in errors; p_run_id is the source.
-- Raises: PF006 no such run; PF013 the run is not failed (only a failed run, cancelled ones
-- included, can be restarted: a started run is still going, a completed one has nothing to redo).
CREATE OR REPLACE FUNCTION pgflow._lock_restart_source(p_function text, p_run_id uuid)
RETURNS pgflow.runs
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_flow text;
  v_run pgflow.runs;
BEGIN
  SELECT r.flow_slug INTO v_flow FROM pgflow.runs AS r WHERE r.run_id = p_run_id;
  IF v_flow IS NOT NULL THEN
    PERFORM pg_catalog.pg_advisory_xact_lock_shared(1, pg_catalog.hashtext(v_flow));
    SELECT r.* INTO v_run FROM pgflow.runs AS r WHERE r.run_id = p_run_id FOR SHARE;
  END IF;
  IF v_run.run_id IS NULL THEN
    RAISE EXCEPTION '%(): run % does not exist', p_function, p_run_id
      USING ERRCODE = 'PF006', HINT = 'pgflow runs list shows the runs';
  END IF;
  IF v_run.status <> 'failed' THEN
    RAISE EXCEPTION '%(): run % is %; only a failed (or cancelled) run can be restarted', p_function, p_run_id, v_run.status
      USING ERRCODE = 'PF013',
            HINT = CASE WHEN v_run.status = 'started' THEN 'await it (pgflow runs wait), or cancel it first (pgflow runs cancel)'
                        ELSE 'start a new run of the flow instead (pgflow runs start)' END;
  END IF;
  RETURN v_run;
END;
$$;
REVOKE ALL ON FUNCTION pgflow._lock_restart_source(text, uuid) FROM PUBLIC;

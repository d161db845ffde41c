-- Resumes a failed (or cancelled) run: a new run of the same flow and input (restart_of_run_id
-- names the source, restart_kind is 'resume') that reuses every task the source completed, map
-- elements included, and queues only the others. The new run goes through the ordinary start path:
-- conditions, empty maps and skips are decided again, as on a fresh run; when one of its steps
-- starts, each task the source completed at the same step and task index is reused (created
-- completed with the source task's output, attempts_count 0, no message) provided the step's
-- dependencies ended exactly as in the source (same state, equal output), so the task's input is
-- the source task's input (start_ready_steps). A step all of whose tasks are reused completes at
-- once and its children start as after any completion. Steps that start later (after a worker
-- completes a re-run task) reuse the same way. The source is not changed.
-- Parameters: run_id, the source run.
-- Returns the new run as it is after starting.
-- Raises: 42501 not an operator; PF006 no such run; PF013 the run is not failed, or the flow was
-- compiled again after the source started (its outputs may belong to another definition: retry
-- instead); what start_flow raises.
CREATE OR REPLACE FUNCTION pgflow.resume_run(run_id uuid)
RETURNS pgflow.runs
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_source pgflow.runs;
  v_run pgflow.runs;
BEGIN
  PERFORM pgflow._require_caller('pgflow_operator', 'resume runs');
  v_source := pgflow._lock_restart_source('resume_run', resume_run.run_id);
  IF EXISTS (SELECT 1 FROM pgflow.flows AS f
             WHERE f.flow_slug = v_source.flow_slug AND f.created_at > v_source.started_at) THEN
    RAISE EXCEPTION 'resume_run(): flow "%" was compiled again after run % started; its task outputs may not fit the flow now',
      v_source.flow_slug, v_source.run_id
      USING ERRCODE = 'PF013', HINT = 'retry the run instead (pgflow runs retry): a fresh run reuses nothing';
  END IF;
  SELECT r.* INTO v_run
  FROM pgflow._start_runs('resume_run', v_source.flow_slug, pg_catalog.jsonb_build_array(v_source.input), NULL,
                          v_source.run_id, 'resume') AS r;
  RETURN v_run;
END;
$$;

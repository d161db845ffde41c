-- Retries a failed (or cancelled) run as a fresh run: a new run of the same flow with exactly the
-- source's input, started through the ordinary start path (conditions, empty maps, start delays,
-- events), reusing nothing of the source; restart_of_run_id names the source (the immediate one:
-- a retry of a retry names the retry) and restart_kind is 'retry'. The source is not changed.
-- The current definition of the flow runs: an input it cannot take any more (a root map step
-- added since) raises what start_flow raises.
-- Parameters: run_id, the source run.
-- Returns the new run as it is after starting.
-- Raises: 42501 not an operator; PF006 no such run; PF013 the run is not failed
-- (_lock_restart_source); what start_flow raises.
CREATE OR REPLACE FUNCTION pgflow.retry_run(run_id uuid)
RETURNS pgflow.runs
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_source pgflow.runs;
  v_run pgflow.runs;
BEGIN
  PERFORM pgflow._require_caller('pgflow_operator', 'retry runs');
  v_source := pgflow._lock_restart_source('retry_run', retry_run.run_id);
  SELECT r.* INTO v_run
  FROM pgflow._start_runs('retry_run', v_source.flow_slug, pg_catalog.jsonb_build_array(v_source.input), NULL,
                          v_source.run_id, 'retry') AS r;
  RETURN v_run;
END;
$$;

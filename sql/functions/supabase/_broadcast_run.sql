-- Broadcast of a run transition; the event is derived from the row's status.
CREATE OR REPLACE FUNCTION pgflow._broadcast_run(p_run pgflow.runs, p_error_message text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
DECLARE
  v_payload jsonb;
BEGIN
  IF pg_catalog.to_regprocedure('realtime.send(jsonb,text,text,boolean)') IS NULL THEN
    RETURN;
  END IF;
  v_payload := pg_catalog.jsonb_build_object(
    'event_type', 'run:' || p_run.status,
    'run_id', p_run.run_id,
    'flow_slug', p_run.flow_slug,
    'status', p_run.status,
    'remaining_steps', p_run.remaining_steps,
    'started_at', p_run.started_at);
  IF p_run.status = 'started' THEN
    v_payload := v_payload || pg_catalog.jsonb_build_object('input', p_run.input);
  ELSIF p_run.status = 'completed' THEN
    v_payload := v_payload || pg_catalog.jsonb_build_object('output', p_run.output, 'completed_at', p_run.completed_at);
  ELSIF p_run.status = 'failed' THEN
    v_payload := v_payload || pg_catalog.jsonb_build_object('error_message', p_error_message, 'failed_at', p_run.failed_at);
  END IF;
  PERFORM pgflow._broadcast(v_payload, 'run:' || p_run.status, 'pgflow:run:' || p_run.run_id::text);
END;
$$;

-- Broadcast of a step transition; the event is derived from the row's status.
CREATE OR REPLACE FUNCTION pgflow._broadcast_step(p_state pgflow.step_states)
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
    'event_type', 'step:' || p_state.status,
    'run_id', p_state.run_id,
    'flow_slug', p_state.flow_slug,
    'step_slug', p_state.step_slug,
    'status', p_state.status,
    'started_at', p_state.started_at,
    'remaining_tasks', p_state.remaining_tasks,
    'remaining_deps', p_state.remaining_deps);
  IF p_state.status = 'completed' THEN
    v_payload := v_payload || pg_catalog.jsonb_build_object('output', p_state.output, 'completed_at', p_state.completed_at);
  ELSIF p_state.status = 'failed' THEN
    v_payload := v_payload || pg_catalog.jsonb_build_object('error_message', p_state.error_message, 'failed_at', p_state.failed_at);
  ELSIF p_state.status = 'skipped' THEN
    v_payload := v_payload || pg_catalog.jsonb_build_object('skip_reason', p_state.skip_reason, 'skipped_at', p_state.skipped_at);
  END IF;
  PERFORM pgflow._broadcast(v_payload,
                            'step:' || p_state.step_slug || ':' || p_state.status,
                            'pgflow:run:' || p_state.run_id::text);
END;
$$;

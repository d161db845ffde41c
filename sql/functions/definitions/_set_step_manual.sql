-- Marks a step that _create_flow_from_shape just added as manual (execution_mode 'manual'): its
-- tasks get no queue, no message and no worker (docs/manual-tasks.md). Only a step without any
-- step state can change mode; a step of an existing flow never does (switching between manual and
-- queue-backed is a shape difference: recompile locally, or deploy a new concrete flow slug).
-- steps.queue_name keeps the flow's default queue (its route namespace); no task of the step
-- ever uses it. Raises PF003 when the step is unknown or already has runs.
CREATE OR REPLACE FUNCTION pgflow._set_step_manual(p_flow_slug text, p_step_slug text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
BEGIN
  UPDATE pgflow.steps AS s SET execution_mode = 'manual'
   WHERE s.flow_slug = p_flow_slug AND s.step_slug = p_step_slug
     AND NOT EXISTS (SELECT 1 FROM pgflow.step_states AS ss WHERE ss.flow_slug = s.flow_slug AND ss.step_slug = s.step_slug);
  IF NOT FOUND THEN
    RAISE EXCEPTION 'step "%" of flow "%" cannot become manual: it does not exist or already has runs', p_step_slug, p_flow_slug
      USING ERRCODE = 'PF003', HINT = 'the execution mode is part of the flow shape: use a new concrete flow slug';
  END IF;
END;
$$;
REVOKE ALL ON FUNCTION pgflow._set_step_manual(text, text) FROM PUBLIC;

-- Completes a started run whose steps are all done. Output: {leaf_step: output} of the leaf
-- steps (no dependents) that completed; skipped leaves are left out.
CREATE OR REPLACE FUNCTION pgflow.maybe_complete_run(run_id uuid)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_run pgflow.runs;
BEGIN
  UPDATE pgflow.runs AS r
     SET status = 'completed',
         completed_at = pg_catalog.now(),
         output = coalesce((
           SELECT pg_catalog.jsonb_object_agg(ss.step_slug, ss.output)
           FROM pgflow.step_states AS ss
           WHERE ss.run_id = r.run_id AND ss.status = 'completed'
             AND NOT EXISTS (SELECT 1 FROM pgflow.deps AS d
                             WHERE d.flow_slug = ss.flow_slug AND d.dep_slug = ss.step_slug)), '{}'::jsonb)
   WHERE r.run_id = maybe_complete_run.run_id AND r.status = 'started' AND r.remaining_steps = 0
  RETURNING r.* INTO v_run;
  IF v_run.run_id IS NOT NULL THEN
    PERFORM pgflow._broadcast_run(v_run);
  END IF;
END;
$$;

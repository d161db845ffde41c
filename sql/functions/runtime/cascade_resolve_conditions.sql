-- Evaluates the if/ifNot conditions of every created step whose dependencies are all done,
-- until nothing changes. Input of a condition: the run input for a root step, otherwise
-- {dep_slug: output} of its completed dependencies. Met = (if is NULL or input @> if) and
-- (ifNot is NULL or not input @> ifNot). Unmet, by when_unmet:
--   fail         -> the first such step (step_index order) and the run fail; returns false
--   skip         -> the step is skipped (condition_unmet), its children are released
--   skip-cascade -> the step and everything below it are skipped
-- Returns true for a started or completed run, false for a failed (or missing) one.
CREATE OR REPLACE FUNCTION pgflow.cascade_resolve_conditions(run_id uuid)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_status text;
  v_unmet record;
  v_found boolean;
BEGIN
  SELECT r.status INTO v_status FROM pgflow.runs AS r WHERE r.run_id = cascade_resolve_conditions.run_id;
  IF v_status = 'completed' THEN
    RETURN true;
  ELSIF v_status IS DISTINCT FROM 'started' THEN
    RETURN false;
  END IF;

  LOOP
    v_found := false;
    FOR v_unmet IN
      WITH candidates AS (
        SELECT ss.step_slug, s.step_index, s.when_unmet,
               s.required_input_pattern AS if_pattern, s.forbidden_input_pattern AS if_not_pattern,
               CASE WHEN s.deps_count = 0 THEN r.input
                    ELSE coalesce((
                      SELECT pg_catalog.jsonb_object_agg(d.dep_slug, ds.output)
                      FROM pgflow.deps AS d
                      JOIN pgflow.step_states AS ds ON ds.run_id = ss.run_id AND ds.step_slug = d.dep_slug
                      WHERE d.flow_slug = ss.flow_slug AND d.step_slug = ss.step_slug AND ds.status = 'completed'),
                      '{}'::jsonb)
               END AS cond_input
        FROM pgflow.step_states AS ss
        JOIN pgflow.steps AS s ON s.flow_slug = ss.flow_slug AND s.step_slug = ss.step_slug
        JOIN pgflow.runs AS r ON r.run_id = ss.run_id
        WHERE ss.run_id = cascade_resolve_conditions.run_id
          AND ss.status = 'created' AND ss.remaining_deps = 0
          AND (s.required_input_pattern IS NOT NULL OR s.forbidden_input_pattern IS NOT NULL)
      )
      SELECT c.step_slug, c.when_unmet
      FROM candidates AS c
      WHERE NOT ((c.if_pattern IS NULL OR c.cond_input @> c.if_pattern)
                 AND (c.if_not_pattern IS NULL OR NOT (c.cond_input @> c.if_not_pattern)))
      ORDER BY (c.when_unmet = 'fail') DESC, c.step_index
    LOOP
      v_found := true;
      IF v_unmet.when_unmet = 'fail' THEN
        -- released pgflow's exact text (its tests pin it); the failed step is the row that holds it
        PERFORM pgflow._fail_run(cascade_resolve_conditions.run_id, v_unmet.step_slug, 'Condition not met');
        RETURN false;
      ELSIF v_unmet.when_unmet = 'skip' THEN
        PERFORM pgflow._skip_step(cascade_resolve_conditions.run_id, v_unmet.step_slug, 'condition_unmet');
      ELSE
        PERFORM pgflow._cascade_force_skip_steps(cascade_resolve_conditions.run_id, v_unmet.step_slug, 'condition_unmet');
      END IF;
    END LOOP;
    EXIT WHEN NOT v_found;
  END LOOP;
  RETURN true;
END;
$$;

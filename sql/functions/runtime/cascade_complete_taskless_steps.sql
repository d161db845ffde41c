-- Completes every created step that is ready and has no tasks (an empty map, or a map whose
-- only dependency produced nothing), with output [] for a map and NULL for a single step, and
-- propagates to the children. Conditions are resolved before each pass, so a conditional step
-- is never completed without its condition being checked. Repeats until nothing changes and
-- returns the number of steps completed.
CREATE OR REPLACE FUNCTION pgflow.cascade_complete_taskless_steps(run_id uuid)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = ''
AS $$
#variable_conflict use_column
DECLARE
  v_flow text;
  v_done text[];
  v_total integer := 0;
  v_state pgflow.step_states;
BEGIN
  LOOP
    IF NOT pgflow.cascade_resolve_conditions(cascade_complete_taskless_steps.run_id) THEN
      EXIT;
    END IF;
    SELECT r.flow_slug INTO v_flow FROM pgflow.runs AS r
    WHERE r.run_id = cascade_complete_taskless_steps.run_id AND r.status = 'started';
    EXIT WHEN v_flow IS NULL;

    WITH done AS (
      UPDATE pgflow.step_states AS ss
         SET status = 'completed',
             started_at = pg_catalog.now(),
             completed_at = pg_catalog.now(),
             remaining_tasks = 0,
             output = CASE WHEN s.step_type = 'map' THEN '[]'::jsonb ELSE NULL END
        FROM pgflow.steps AS s
       WHERE s.flow_slug = ss.flow_slug AND s.step_slug = ss.step_slug
         AND ss.run_id = cascade_complete_taskless_steps.run_id
         AND ss.status = 'created' AND ss.remaining_deps = 0 AND ss.initial_tasks = 0
      RETURNING ss.step_slug
    )
    SELECT pg_catalog.array_agg(d.step_slug ORDER BY d.step_slug) INTO v_done FROM done AS d;
    EXIT WHEN v_done IS NULL;

    UPDATE pgflow.step_states AS cs
       SET remaining_deps = cs.remaining_deps - x.finished,
           initial_tasks = CASE WHEN c.step_type = 'map' AND cs.initial_tasks IS NULL THEN 0 ELSE cs.initial_tasks END
      FROM (SELECT d.step_slug, pg_catalog.count(*)::integer AS finished
            FROM pgflow.deps AS d
            WHERE d.flow_slug = v_flow AND d.dep_slug = ANY (v_done)
            GROUP BY d.step_slug) AS x
      JOIN pgflow.steps AS c ON c.flow_slug = v_flow AND c.step_slug = x.step_slug
     WHERE cs.run_id = cascade_complete_taskless_steps.run_id
       AND cs.step_slug = x.step_slug AND cs.status = 'created';

    UPDATE pgflow.runs AS r
       SET remaining_steps = r.remaining_steps - pg_catalog.cardinality(v_done)
     WHERE r.run_id = cascade_complete_taskless_steps.run_id;

    FOR v_state IN
      SELECT ss.* FROM pgflow.step_states AS ss
      WHERE ss.run_id = cascade_complete_taskless_steps.run_id AND ss.step_slug = ANY (v_done)
      ORDER BY ss.step_slug
    LOOP
      PERFORM pgflow._broadcast_step(v_state);
    END LOOP;
    v_total := v_total + pg_catalog.cardinality(v_done);
  END LOOP;
  RETURN v_total;
END;
$$;

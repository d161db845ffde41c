    IF pg_catalog.jsonb_typeof(v_state.output) = 'array' THEN
      v_child_tasks := pg_catalog.jsonb_array_length(v_state.output);
    END IF;

    UPDATE pgflow.step_states AS cs
       SET remaining_deps = cs.remaining_deps - 1,
           initial_tasks = CASE
             WHEN c.step_type = 'map' AND cs.initial_tasks IS NULL THEN v_child_tasks
             ELSE cs.initial_tasks END
      FROM pgflow.deps AS d
      JOIN pgflow.steps AS c ON c.flow_slug = d.flow_slug AND c.step_slug = d.step_slug
     WHERE d.flow_slug = v_flow AND d.dep_slug = p_step_slug
       AND cs.run_id = p_run_id AND cs.step_slug = d.step_slug AND cs.status = 'created';

    UPDATE pgflow.runs AS r SET remaining_steps = r.remaining_steps - 1 WHERE r.run_id = p_run_id;

-- Releases the children of a step that just finished without producing tasks for them to wait
-- on (skipped): remaining_deps - 1, and a map child that does not know its size yet gets 0
-- tasks (its only dependency produced nothing).
CREATE OR REPLACE FUNCTION pgflow._release_children_of_skipped(p_run_id uuid, p_flow_slug text, p_step_slug text)
RETURNS void
LANGUAGE sql
VOLATILE
SET search_path = ''
AS $$
  UPDATE pgflow.step_states AS cs
     SET remaining_deps = cs.remaining_deps - 1,
         initial_tasks = CASE WHEN c.step_type = 'map' AND cs.initial_tasks IS NULL THEN 0 ELSE cs.initial_tasks END
    FROM pgflow.deps AS d
    JOIN pgflow.steps AS c ON c.flow_slug = d.flow_slug AND c.step_slug = d.step_slug
   WHERE d.flow_slug = p_flow_slug AND d.dep_slug = p_step_slug
     AND cs.run_id = p_run_id AND cs.step_slug = d.step_slug AND cs.status = 'created';
$$;

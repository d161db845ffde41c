-- Fragment: the SET list of an UPDATE of pgflow.runs AS r (a started run, its lock held) whose step
-- completed: the run has one step less and, when that was its last step, completes in the same row
-- version, as maybe_complete_run would complete it next: status, completed_at and output, the
-- {leaf_step: output} of the leaf steps (no dependents) that completed, {} for none. No cascade
-- can change a run with no step left, so completing it at once is what _advance_run would do; one
-- write instead of two spares a second row version and its foreign-key check.
remaining_steps = r.remaining_steps - 1,
status = CASE WHEN r.remaining_steps = 1 THEN 'completed' ELSE r.status END,
completed_at = CASE WHEN r.remaining_steps = 1 THEN pg_catalog.now() ELSE r.completed_at END,
output = CASE WHEN r.remaining_steps <> 1 THEN r.output
              ELSE coalesce((SELECT pg_catalog.jsonb_object_agg(ls.step_slug, ls.output)
                             FROM pgflow.step_states AS ls
                             WHERE ls.run_id = r.run_id AND ls.status = 'completed'
                               AND NOT EXISTS (SELECT 1 FROM pgflow.deps AS ld
                                               WHERE ld.flow_slug = ls.flow_slug AND ld.dep_slug = ls.step_slug)),
                            '{}'::jsonb) END

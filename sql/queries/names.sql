-- The names a slug given on the command line may have meant ("did you mean"). Read-only.

--@name flow_slugs
SELECT f.flow_slug FROM pgflow.flows AS f ORDER BY f.flow_slug COLLATE "C";

--@name run_step_slugs
-- The steps of the flow of run %(run_id)s (none when there is no such run).
SELECT s.step_slug
FROM pgflow.runs AS r
JOIN pgflow.steps AS s ON s.flow_slug = r.flow_slug
WHERE r.run_id = %(run_id)s::uuid
ORDER BY s.step_index;
--@end

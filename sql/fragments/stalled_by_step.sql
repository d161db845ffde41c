-- Fragment of sql/queries/status.sql: started tasks per flow and step against the stalled candidates.
-- Input relation: candidates(run_id, step_slug, task_index), the tasks the next
-- pgflow.requeue_stalled_tasks() call takes. Parameter %(flow)s (a slug or NULL).
-- Output: (flow_slug, step_slug, stalled, permanently_stalled, oldest_stalled_started_at); `pgflow status`
-- sums the steps of a flow, the exporter reports each route (a plain flow's route: all its steps).
SELECT t.flow_slug,
       t.step_slug,
       pg_catalog.count(*) FILTER (WHERE c.run_id IS NOT NULL)::integer AS stalled,
       pg_catalog.count(*) FILTER (WHERE t.permanently_stalled_at IS NOT NULL)::integer AS permanently_stalled,
       pg_catalog.min(t.started_at) FILTER (WHERE c.run_id IS NOT NULL) AS oldest_stalled_started_at
FROM pgflow.step_tasks AS t
LEFT JOIN candidates AS c ON c.run_id = t.run_id AND c.step_slug = t.step_slug AND c.task_index = t.task_index
WHERE t.status = 'started'
  AND (%(flow)s::text IS NULL OR t.flow_slug = %(flow)s::text)
GROUP BY t.flow_slug, t.step_slug

-- Fragment: the tasks of each flow that still need their queue: queued (a message waits to be
-- read) or started (its message will be archived). Output: (flow_slug, queued_tasks, started_tasks).
SELECT t.flow_slug,
       count(*) FILTER (WHERE t.status = 'queued') AS queued_tasks,
       count(*) FILTER (WHERE t.status = 'started') AS started_tasks
FROM pgflow.step_tasks AS t
WHERE t.status IN ('queued', 'started')
GROUP BY t.flow_slug

-- Fragment of sql/queries/manual_tasks.sql: the columns and joins of one task report row (the
-- task, its run's and step state's status, the step type, its age in seconds), for `list_waiting`
-- and `show`; each adds its WHERE clause. Never the task's input or output.
SELECT t.run_id, t.flow_slug, t.step_slug, t.task_index, t.status, t.execution_mode,
       t.started_at, t.completed_at, t.failed_at, t.error_message,
       r.status AS run_status, ss.status AS step_status, s.step_type,
       extract(epoch FROM (clock_timestamp() - t.started_at))::double precision AS age_seconds
FROM pgflow.step_tasks AS t
JOIN pgflow.runs AS r ON r.run_id = t.run_id
JOIN pgflow.step_states AS ss ON ss.run_id = t.run_id AND ss.step_slug = t.step_slug
JOIN pgflow.steps AS s ON s.flow_slug = t.flow_slug AND s.step_slug = t.step_slug

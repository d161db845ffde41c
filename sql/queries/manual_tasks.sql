-- Queries of `pgflow task` and pgflow_cli.operations.manual_tasks (docs/manual-tasks.md).
-- Task inputs and outputs are never selected: reports name tasks, they do not carry their data.

--@name list_waiting
-- Waiting manual tasks (started, in a started step of a started run), oldest first.
-- %(flow_slug)s: NULL for every flow; %(older_than)s: seconds (NULL: any age); %(limit)s rows.
--@include fragments/manual_task_report.sql
WHERE t.execution_mode = 'manual' AND t.status = 'started'
  AND r.status = 'started' AND ss.status = 'started'
  AND (%(flow_slug)s::text IS NULL OR t.flow_slug = %(flow_slug)s::text)
  AND (%(older_than)s::double precision IS NULL
       OR t.started_at < clock_timestamp() - make_interval(secs => %(older_than)s::double precision))
ORDER BY t.started_at, t.run_id, t.step_slug, t.task_index
LIMIT %(limit)s;

--@name show
-- One task by its address, manual or not (the caller reports a queue-backed one as such).
--@include fragments/manual_task_report.sql
WHERE t.run_id = %(run_id)s::uuid AND t.step_slug = %(step_slug)s::text AND t.task_index = %(task_index)s::integer;

--@name complete
SELECT t.run_id FROM pgflow.complete_manual_task(%(run_id)s::uuid, %(step_slug)s::text, %(task_index)s::integer,
                                                  %(output)s::jsonb) AS t;

--@name fail
SELECT t.run_id FROM pgflow.fail_manual_task(%(run_id)s::uuid, %(step_slug)s::text, %(task_index)s::integer,
                                              %(error_message)s::text) AS t;
--@end

-- The local development loop (docs/step-queues.md "Developing a flow"): is this database in local
-- mode, and what a recompilation there would delete. Read-only.

--@name is_local
-- pgflow.is_local() where the function exists (every level from the baseline on), else false.
SELECT CASE WHEN pg_catalog.to_regprocedure('pgflow.is_local()') IS NULL THEN false
            ELSE (SELECT pgflow.is_local()) END AS is_local;

--@name flow_contents
-- The rows of flow %(flow_slug)s (exact slug) that a recompilation deletes, counted before it runs.
SELECT (SELECT pg_catalog.count(*) FROM pgflow.runs AS r WHERE r.flow_slug = %(flow_slug)s)::integer AS runs,
       (SELECT pg_catalog.count(*) FROM pgflow.runs AS r
        WHERE r.flow_slug = %(flow_slug)s AND r.status = 'started')::integer AS runs_in_flight,
       (SELECT pg_catalog.count(*) FROM pgflow.step_tasks AS t WHERE t.flow_slug = %(flow_slug)s)::integer AS tasks,
       (SELECT pg_catalog.count(*) FROM pgflow.step_tasks AS t
        WHERE t.flow_slug = %(flow_slug)s AND t.status IN ('queued', 'started'))::integer AS tasks_in_flight;
--@end

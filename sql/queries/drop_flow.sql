-- Queries of `pgflow drop-flow` (pgflow_cli/operations/drop_flow.py). The deletion itself and its
-- plan are SQL functions (sql/functions/drop_flow/); these only call them, export, and verify.

--@name installed
-- Whether this database has whole-flow deletion (migration 0003).
SELECT pg_catalog.to_regprocedure('pgflow.drop_flow(text, boolean)') IS NOT NULL
   AND pg_catalog.to_regprocedure('pgflow.drop_flow_plan(text)') IS NOT NULL AS installed;

--@name plan
SELECT pgflow.drop_flow_plan(%(flow_slug)s) AS plan;

--@name lock
-- The deletion's locks (flow advisory locks, then every run FOR UPDATE), taken before the export so
-- the exported history is exactly what is deleted.
SELECT pgflow._lock_flow_for_deletion(%(flow_slug)s) AS runs_locked;

--@name drop
SELECT pgflow.drop_flow(%(flow_slug)s, force => %(force)s) AS result;

--@name export_definition
-- The definition as rows, plus the shape startup compilation compares (pgflow._get_flow_shape).
SELECT pg_catalog.jsonb_build_object(
         'flow', (SELECT pg_catalog.to_jsonb(f) FROM pgflow.flows AS f WHERE f.flow_slug = %(flow_slug)s),
         'steps', coalesce((SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(s) ORDER BY s.step_index)
                            FROM pgflow.steps AS s WHERE s.flow_slug = %(flow_slug)s), '[]'::jsonb),
         'deps', coalesce((SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(d) ORDER BY d.step_slug, d.dep_slug)
                           FROM pgflow.deps AS d WHERE d.flow_slug = %(flow_slug)s), '[]'::jsonb),
         'shape', pgflow._get_flow_shape(%(flow_slug)s)
       )::text AS definition;

--@name export_runs
-- One JSON object per line: the run rows, with their input and output (run history).
SELECT pg_catalog.to_jsonb(r)::text AS line FROM pgflow.runs AS r
WHERE r.flow_slug = %(flow_slug)s ORDER BY r.started_at, r.run_id;

--@name export_step_states
-- One step state row per line, in (run_id, step_slug) order. The steps of a run with a completed step
-- whose output was never stored (it finished before an adoption of pgflow 0.8-0.12, and the history
-- backfill has not stored the outputs yet) are the "steps" of pgflow.get_run_with_states (migration
-- 0003), which computes such an output from the tasks: the computation keeps its one home there,
-- and is asked only for those runs (one call per run). Every other line is the row itself.
WITH computed AS (
  SELECT DISTINCT ss.run_id FROM pgflow.step_states AS ss
  WHERE ss.flow_slug = %(flow_slug)s AND ss.status = 'completed' AND ss.output IS NULL
)
SELECT x.line
FROM (
  SELECT ss.run_id, ss.step_slug, pg_catalog.to_jsonb(ss)::text AS line
  FROM pgflow.step_states AS ss
  WHERE ss.flow_slug = %(flow_slug)s AND ss.run_id NOT IN (SELECT c.run_id FROM computed AS c)
  UNION ALL
  SELECT c.run_id, step ->> 'step_slug', step::text
  FROM computed AS c
  CROSS JOIN LATERAL pg_catalog.jsonb_array_elements(pgflow.get_run_with_states(c.run_id) -> 'steps') AS step
) AS x
ORDER BY x.run_id, x.step_slug;

--@name export_step_tasks
-- Task rows with their outputs and errors; queue messages are not exported (a pgflow message only
-- points at its task, and anything else in a queue is not pgflow's to copy).
SELECT pg_catalog.to_jsonb(t)::text AS line FROM pgflow.step_tasks AS t
WHERE t.flow_slug = %(flow_slug)s ORDER BY t.run_id, t.step_slug, t.task_index;

--@name leftovers
-- After the deletion committed: what is left of the flow, per table, and of its queues (by the names
-- the deletion reported). Every count must be 0 and every queue absent.
SELECT 'pgflow.' || x.tbl AS what, x.n
FROM (VALUES
        ('flows', (SELECT pg_catalog.count(*) FROM pgflow.flows AS f WHERE f.flow_slug = %(flow_slug)s)),
        ('steps', (SELECT pg_catalog.count(*) FROM pgflow.steps AS s WHERE s.flow_slug = %(flow_slug)s)),
        ('deps', (SELECT pg_catalog.count(*) FROM pgflow.deps AS d WHERE d.flow_slug = %(flow_slug)s)),
        ('runs', (SELECT pg_catalog.count(*) FROM pgflow.runs AS r WHERE r.flow_slug = %(flow_slug)s)),
        ('step_states', (SELECT pg_catalog.count(*) FROM pgflow.step_states AS ss WHERE ss.flow_slug = %(flow_slug)s)),
        ('step_tasks', (SELECT pg_catalog.count(*) FROM pgflow.step_tasks AS t WHERE t.flow_slug = %(flow_slug)s))
     ) AS x (tbl, n)
WHERE x.n > 0
UNION ALL
SELECT pg_catalog.format('queue %%s (%%s)', q.name, what.kind), 1
FROM pg_catalog.unnest(%(queues)s::text[]) AS q (name)
CROSS JOIN LATERAL (
  SELECT 'queue table' AS kind WHERE pg_catalog.to_regclass(pg_catalog.format('pgmq.%%I', pgmq.format_table_name(q.name, 'q'))) IS NOT NULL
  UNION ALL
  SELECT 'archive table' WHERE pg_catalog.to_regclass(pg_catalog.format('pgmq.%%I', pgmq.format_table_name(q.name, 'a'))) IS NOT NULL
  UNION ALL
  SELECT 'pgmq.meta row ' || pg_catalog.quote_literal(m.queue_name::text)
  FROM pgmq.meta AS m WHERE pg_catalog.lower(m.queue_name::text COLLATE "C") = pg_catalog.lower(q.name COLLATE "C")
) AS what
ORDER BY 1;
--@end

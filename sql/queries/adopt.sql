-- Queries of pgflow_cli.upstream.adopt (adopting a schema a published pgflow release installed).

--@name replaced_table
-- The functions adoption replaces, by name (read by sql/adoption/*.sql); gone at commit.
CREATE TEMP TABLE pgflow_adopt_replaced (
  name         text PRIMARY KEY,
  replaced_by  text
) ON COMMIT DROP

--@name replaced_rows
INSERT INTO pg_temp.pgflow_adopt_replaced (name, replaced_by)
SELECT r.name, r.replaced_by
FROM unnest(%(names)s::text[], %(replaced_by)s::text[]) AS r (name, replaced_by)

--@name adoption_insert
INSERT INTO pgflow.schema_adoption (release, releases, assumed, differences, cron_jobs, supabase_history,
                                    checksum, tool_version, pending, completed_at)
VALUES (%(release)s, %(releases)s, %(assumed)s, %(differences)s, %(cron_jobs)s, %(supabase_history)s,
        %(checksum)s, %(tool_version)s, %(pending)s, CASE WHEN %(complete)s THEN now() END)

--@name adoption_pending
-- The completion steps an online adoption left for after its commit (empty when complete).
SELECT pending FROM pgflow.schema_adoption WHERE completed_at IS NULL ORDER BY adopted_at DESC LIMIT 1

--@name adoption_progress
-- One completion step done; the record is complete when none is left.
UPDATE pgflow.schema_adoption
SET pending = %(pending)s,
    completed_at = CASE WHEN pg_catalog.jsonb_array_length(%(pending)s) = 0 THEN now() END
WHERE completed_at IS NULL

--@name live_workers
-- Workers with a recent heartbeat that were not deprecated, in columns every release has.
SELECT count(*) AS alive, count(DISTINCT function_name) AS functions
FROM pgflow.workers
WHERE deprecated_at IS NULL AND last_heartbeat_at > now() - interval '30 seconds'

--@name disabled_functions
-- Worker functions an upstream release registered with enabled = false (0.10+: the table exists).
SELECT function_name FROM pgflow.worker_functions WHERE NOT enabled ORDER BY function_name

--@name runtime_bytes
-- Heap bytes of the two tables adoption rewrites or scans (no scan: the relation's size).
SELECT pg_catalog.pg_relation_size('pgflow.step_states') + pg_catalog.pg_relation_size('pgflow.step_tasks') AS bytes

--@name step_states_pages
-- Heap pages of step_states (the history backfill's progress is a page number; no scan).
SELECT pg_catalog.pg_relation_size('pgflow.step_states') / pg_catalog.current_setting('block_size')::bigint

--@name has_worker_functions
SELECT pg_catalog.to_regclass('pgflow.worker_functions') IS NOT NULL

--@name has_output_column
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
               WHERE attrelid = 'pgflow.step_states'::regclass AND attname = 'output' AND NOT attisdropped)

--@name step_output_backfill
-- The 0.13.0 data migration, over one range of step_states heap pages: a completed single step
-- gets its completed task's output, a completed map step the outputs of its completed tasks in
-- task_index order ([] when it had none). Steps that already have an output are skipped, so a
-- rerun after an interruption continues where it stopped. With in_flight_only, only steps of
-- runs still started (what the adopted runtime will read) are touched, found through the runs
-- status index, and the page range is ignored.
-- Returns (rows updated, heap pages of step_states).
WITH target AS (
  SELECT ss.run_id, ss.step_slug, ss.flow_slug
  FROM pgflow.step_states AS ss
  WHERE NOT %(in_flight_only)s
    AND ss.ctid >= pg_catalog.format('(%%s,0)', %(first_page)s::bigint)::tid
    AND ss.ctid < pg_catalog.format('(%%s,0)', %(first_page)s::bigint + %(pages)s::bigint)::tid
    AND ss.status = 'completed' AND ss.output IS NULL
  UNION ALL
  SELECT ss.run_id, ss.step_slug, ss.flow_slug
  FROM pgflow.runs AS r
  JOIN pgflow.step_states AS ss ON ss.run_id = r.run_id
  WHERE %(in_flight_only)s AND r.status = 'started' AND ss.status = 'completed' AND ss.output IS NULL
), computed AS (
  SELECT t.run_id, t.step_slug,
         CASE WHEN s.step_type = 'map' THEN
           COALESCE(pg_catalog.jsonb_agg(k.output ORDER BY k.task_index) FILTER (WHERE k.status = 'completed'),
                    '[]'::jsonb)
         ELSE (pg_catalog.array_agg(k.output) FILTER (WHERE k.status = 'completed' AND k.task_index = 0))[1]
         END AS output
  FROM target AS t
  JOIN pgflow.steps AS s ON s.flow_slug = t.flow_slug AND s.step_slug = t.step_slug
  LEFT JOIN pgflow.step_tasks AS k ON k.run_id = t.run_id AND k.step_slug = t.step_slug
  GROUP BY t.run_id, t.step_slug, s.step_type
), updated AS (
  UPDATE pgflow.step_states AS ss
  SET output = c.output
  FROM computed AS c
  WHERE ss.run_id = c.run_id AND ss.step_slug = c.step_slug AND c.output IS NOT NULL
  RETURNING 1
)
SELECT (SELECT pg_catalog.count(*) FROM updated) AS rows_updated,
       pg_catalog.pg_relation_size('pgflow.step_states') / pg_catalog.current_setting('block_size')::bigint AS pages

--@name unvalidated_constraints
-- CHECK constraints of pgflow tables that are NOT VALID (table, constraint).
SELECT c.relname::text AS table_name, co.conname::text AS constraint_name
FROM pg_catalog.pg_constraint AS co
JOIN pg_catalog.pg_class AS c ON c.oid = co.conrelid
WHERE c.relnamespace = 'pgflow'::regnamespace AND co.contype = 'c' AND NOT co.convalidated
ORDER BY 1, 2

--@name validate_constraint
-- Template: identifiers are filled in with psycopg.sql.Identifier. SHARE UPDATE EXCLUSIVE only:
-- reads and writes of the table go on while it scans.
ALTER TABLE pgflow.{table} VALIDATE CONSTRAINT {constraint}

--@name skipped_index
CREATE INDEX IF NOT EXISTS idx_step_states_skipped ON pgflow.step_states (run_id, step_slug) WHERE status = 'skipped'

--@name skipped_index_concurrently
-- The adoption's online completion (outside any transaction); the installer drops an invalid
-- leftover of an interrupted build first and checks the index valid afterwards.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_step_states_skipped ON pgflow.step_states (run_id, step_slug)
  WHERE status = 'skipped'
--@end

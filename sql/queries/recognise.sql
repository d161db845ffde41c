-- Catalog facts for recognising which pgflow release installed a database
-- (pgflow_cli.upstream.recognise). Catalog reads only: no table of pgflow is scanned.

--@name catalog_facts
-- One row per object of schema pgflow: kind, name, detail, body (md5 of a function's source).
--   table       relname                          ''
--   column      table.column                     type [not null] [default <expr>]
--   attribute   type.attribute                   type (composite types)
--   constraint  table.constraint                 contype letter (p f u c x) | definition
--   index       index name                       table
--   function    name(identity arguments)         result type
--   context     name                             value (ledger, cron, supabase history...)
WITH ns AS (
  SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = 'pgflow'
)
SELECT 'table' AS kind, c.relname::text AS name, '' AS detail, NULL::text AS body
FROM pg_catalog.pg_class AS c
WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relkind IN ('r', 'p')
  AND c.relname NOT IN ('schema_migrations', 'schema_adoption')
UNION ALL
SELECT CASE c.relkind WHEN 'c' THEN 'attribute' ELSE 'column' END,
       c.relname || '.' || a.attname,
       pg_catalog.format_type(a.atttypid, a.atttypmod)
         || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
         || COALESCE(' default ' || pg_catalog.pg_get_expr(d.adbin, d.adrelid), ''),
       NULL
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_attribute AS a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_catalog.pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relkind IN ('r', 'p', 'c')
  AND c.relname NOT IN ('schema_migrations', 'schema_adoption')
UNION ALL
SELECT 'constraint', c.relname || '.' || co.conname, co.contype::text, pg_catalog.pg_get_constraintdef(co.oid)
FROM pg_catalog.pg_constraint AS co
JOIN pg_catalog.pg_class AS c ON c.oid = co.conrelid
WHERE c.relnamespace = (SELECT oid FROM ns)
  AND c.relname NOT IN ('schema_migrations', 'schema_adoption')
UNION ALL
SELECT 'index', i.relname::text, t.relname::text, NULL
FROM pg_catalog.pg_index AS x
JOIN pg_catalog.pg_class AS i ON i.oid = x.indexrelid
JOIN pg_catalog.pg_class AS t ON t.oid = x.indrelid
WHERE t.relnamespace = (SELECT oid FROM ns)
  AND t.relname NOT IN ('schema_migrations', 'schema_adoption')
UNION ALL
SELECT 'function',
       p.proname || '(' || pg_catalog.pg_get_function_identity_arguments(p.oid) || ')',
       pg_catalog.pg_get_function_result(p.oid),
       pg_catalog.left(pg_catalog.md5(p.prosrc), 8)
FROM pg_catalog.pg_proc AS p
WHERE p.pronamespace = (SELECT oid FROM ns)
UNION ALL
SELECT 'context', v.name, v.value, NULL
FROM (VALUES
  ('schema', (SELECT CASE WHEN EXISTS (SELECT 1 FROM ns) THEN 'present' ELSE 'absent' END)),
  ('ledger', CASE WHEN pg_catalog.to_regclass('pgflow.schema_migrations') IS NULL THEN 'absent' ELSE 'present' END),
  ('adoption_record', CASE WHEN pg_catalog.to_regclass('pgflow.schema_adoption') IS NULL THEN 'absent' ELSE 'present' END),
  ('cron_jobs', CASE WHEN pg_catalog.to_regclass('cron.job') IS NULL THEN 'absent' ELSE 'present' END),
  ('supabase_history', CASE WHEN pg_catalog.to_regclass('supabase_migrations.schema_migrations') IS NULL
                            THEN 'absent' ELSE 'present' END),
  ('pgmq_version', (SELECT e.extversion FROM pg_catalog.pg_extension AS e WHERE e.extname = 'pgmq'))
) AS v (name, value)
ORDER BY 1, 2;

--@name cron_jobs
-- pg_cron jobs whose command mentions pgflow (only run when cron.job exists).
SELECT j.jobid, j.jobname, j.schedule, j.command, j.active
FROM cron.job AS j
WHERE j.command ILIKE '%%pgflow.%%'
ORDER BY j.jobid;

--@name supabase_history
-- The Supabase CLI's migration history rows that name a pgflow migration (only run when the
-- table exists). version = when it was applied (or the original timestamp), name = the file name.
SELECT h.version::text AS version, h.name::text AS name
FROM supabase_migrations.schema_migrations AS h
WHERE h.name ILIKE '%%pgflow%%'
ORDER BY h.version;

--@name adoption_record
-- What pgflow-cli found and adopted (only run when pgflow.schema_adoption exists).
SELECT release, releases, assumed, differences, cron_jobs, supabase_history, checksum, adopted_by, adopted_at,
       tool_version
FROM pgflow.schema_adoption
ORDER BY adopted_at DESC
LIMIT 1;
--@end
